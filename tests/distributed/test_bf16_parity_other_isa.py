"""The bf16 parity tests again, in a subprocess with oneDNN's AMX kernels forced off.

oneDNN picks its bf16 GEMM kernels per host (AMX tiles where the CPU has them, AVX512-BF16 dot
products elsewhere) and reads ONEDNN_MAX_CPU_ISA once per process, so a suite run on one host
only ever checks one of the two. These tests once passed on hosts without AMX and failed on one
with it; running them both ways here keeps the suite from depending on the host it runs on. A
host without AMX already runs them the AVX512 way, and cannot force AMX on: skipped there.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
BF16_PARITY_TESTS = [
    f"{HERE / 'test_tensor_parallel.py'}::test_tp2_fused_decode_step_all_reduces_in_cpp",
    f"{HERE / 'test_data_parallel_attention.py'}::test_bf16_decode_steps_run_in_cpp",
]


def _host_has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _host_has_amx(), reason="no AMX on this host: its default dispatch is already AVX512")
def test_bf16_parity_with_amx_forced_off():
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX512_CORE_BF16")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *BF16_PARITY_TESTS]
    r = subprocess.run(cmd, env=env, cwd=HERE.parent.parent, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout.splitlines()[-1] and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-500:]
