"""The same workers under torchrun: `torchrun --nproc-per-node 2 -m tacit.cli generate
--tensor-parallel-size 2` (env:// rendezvous, steps broadcast over gloo) prints what one
process prints."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tacit.bench.launch import free_port

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")


def generate(path: Path, *launcher: str, tp: int = 1) -> str:
    cmd = [*launcher, "-m", "tacit.cli", "generate", "--model", str(path), "--dtype", "float32"]
    cmd += ["--prompt", "The quick brown fox", "--max-tokens", "12", "--temperature", "0"]
    cmd += ["--tensor-parallel-size", str(tp)]
    out = subprocess.run(
        cmd, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun is not installed beside this python")
def test_torchrun_tp2_generates_what_one_process_does(tiny_llama):
    _, _, path = tiny_llama
    want = generate(path, sys.executable)
    got = generate(path, TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), tp=2)
    assert got == want and want.strip()


def test_a_tensor_parallel_size_unlike_torchruns_world_is_refused(monkeypatch):
    from types import SimpleNamespace

    from tacit.config import ParallelConfig
    from tacit.engine.executor import make_executor

    for key, value in dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"tensor_parallel_size=4 but torchrun started 2 processes"):
        make_executor(SimpleNamespace(parallel=ParallelConfig(tensor_parallel_size=4)), "cpu", None, None)
