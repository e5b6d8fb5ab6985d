"""tacit.platforms: get_platform picks a Platform for "cpu", "cuda" or "auto"."""

import os
import re
import subprocess
import sys

import pytest
import torch

from tacit.platforms import Platform, get_platform
from tacit.platforms.cpu import CpuPlatform, bf16_matmul_is_native
from tacit.platforms.cuda import CudaPlatform

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def test_cpu_platform():
    p = get_platform("cpu")
    assert isinstance(p, CpuPlatform) and isinstance(p, Platform)
    assert p.name == "cpu" and p.device_type == "cpu" and p.dist_backend == "gloo"
    assert p.is_available()
    assert p.device() == torch.device("cpu")
    assert p.device(3) == torch.device("cpu")  # CPU has no index
    # bf16 where oneDNN runs it; float32 on CPUs where torch's bf16 matmul is a scalar fallback
    assert p.default_dtype() is (torch.bfloat16 if bf16_matmul_is_native() else torch.float32)


@pytest.mark.parametrize("native, dtype", [(True, torch.bfloat16), (False, torch.float32)])
def test_cpu_default_dtype_follows_the_bf16_matmul(monkeypatch, native, dtype):
    from tacit.platforms import cpu

    monkeypatch.setattr(cpu, "bf16_matmul_is_native", lambda: native)
    assert CpuPlatform().default_dtype() is dtype


def test_cpu_free_memory_is_sane():
    free = get_platform("cpu").free_memory_bytes()
    assert isinstance(free, int)
    assert 64 * 2**20 < free < 2**50  # more than 64 MiB, less than a petabyte


def test_cpu_with_an_index_is_the_cpu_platform():
    assert isinstance(get_platform("cpu:0"), CpuPlatform)


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cpu:1", "this machine has 1 cpu device(s); valid indices: 0-0"),
        ("cpu:x", "the index after ':' must be a number, e.g. cpu:0"),
        ("cpu:", "the index after ':' must be a number"),
    ],
)
def test_a_device_index_is_honoured_or_refused_never_dropped(device, message):
    with pytest.raises(ValueError, match=re.escape(f"device={device!r}: {message}")):
        get_platform(device)


def test_a_cuda_index_picks_that_device(monkeypatch):
    """Without a GPU here: CUDA with two devices is simulated; "cuda:1" once became cuda:0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert get_platform("cuda:1").device() == torch.device("cuda", 1)
    assert get_platform("cuda").device() == torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"device='cuda:2': this machine has 2 cuda device\(s\); valid indices: 0-1"):
        get_platform("cuda:2")


def test_tensor_parallel_ranks_each_take_their_own_cuda_device(monkeypatch):
    """Simulated 4-GPU host: local rank r of a group started from "cuda:1" runs on cuda:(1 + r)
    and makes it current (NCCL builds on the current device); every rank on one device index
    was the first version's behaviour. Too few devices is refused naming both numbers."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    for local_rank in (0, 1, 2):
        platform = get_platform("cuda:1")
        platform.bind_local_rank(local_rank, 3)
        assert platform.device() == torch.device("cuda", 1 + local_rank)
    assert current == [1, 2, 3]
    with pytest.raises(ValueError, match=r"4 ranks on this host need 4 cuda devices from index 1; this machine has 4"):
        get_platform("cuda:1").bind_local_rank(0, 4)


def test_too_few_cuda_devices_are_refused_before_any_worker_starts(monkeypatch):
    from types import SimpleNamespace

    from tacit.config import ParallelConfig
    from tacit.engine.executor import MultiProcExecutor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    spawned = []
    monkeypatch.setattr(MultiProcExecutor, "_spawn_workers", lambda self, *args: spawned.append(args))
    with pytest.raises(ValueError, match=r"3 ranks on this host need 3 cuda devices from index 0; this machine has 2"):
        MultiProcExecutor(
            SimpleNamespace(parallel=ParallelConfig(tensor_parallel_size=3)), "cuda", None, get_platform("cuda")
        )
    assert not spawned


def test_cpu_ranks_share_the_cpu_device():
    platform = get_platform("cpu")
    platform.bind_local_rank(1, 2)  # they split the cores instead (worker/rank.py pin_to_cores)
    assert platform.device() == torch.device("cpu")


@no_cuda
def test_auto_without_cuda_is_cpu():
    assert isinstance(get_platform("auto"), CpuPlatform)
    assert isinstance(get_platform(), CpuPlatform)  # "auto" is the default


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_with_cuda_is_cuda():
    p = get_platform("auto")
    assert isinstance(p, CudaPlatform)
    assert p.device() == torch.device("cuda", 0)
    assert p.free_memory_bytes() > 0


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_refused_clearly(device):
    assert not CudaPlatform().is_available()
    with pytest.raises(ValueError, match=rf"device='{device}' was asked for but is not available on this machine"):
        get_platform(device)


@pytest.mark.parametrize("device", ["npu", "tpu:0", "CPU", ""])
def test_unknown_device_is_refused_naming_the_valid_ones(device):
    with pytest.raises(ValueError) as err:
        get_platform(device)
    message = str(err.value)
    assert f"device={device!r} is not supported" in message
    assert "valid: auto, cpu, cuda" in message


def test_cpu_platform_caps_onednn_primitive_cache_unless_the_user_set_it(monkeypatch):
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    get_platform("cpu")
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    get_platform("cpu")
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


SHAPES_SCRIPT = """
import sys, torch
from tacit.platforms import get_platform
if sys.argv[1] == "platform":
    get_platform("cpu")
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) / 1024
w, x = torch.randn(1536, 576, dtype=torch.bfloat16), torch.randn(1100, 576, dtype=torch.bfloat16)
for m in range(1, 300):
    torch.nn.functional.linear(x[:m], w)
r0 = rss()
for m in range(300, 1100):  # 800 more prompt lengths, as a soak brings
    torch.nn.functional.linear(x[:m], w)
get_platform("cpu").release_host_memory()
print(rss() - r0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.skipif(not bf16_matmul_is_native(), reason="bf16 matmuls bypass oneDNN (and its cache) on this CPU")
def test_new_matmul_shapes_grow_rss_less_on_the_cpu_platform():
    """Each new prefill length is a new oneDNN matmul shape; with the platform's cache cap 800 of
    them grew RSS by ~150 MB instead of ~420 MB (both trimmed, as the server does when idle)."""

    def growth(mode):
        # Without the setting this process's own platforms put into the environment.
        env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
        r = subprocess.run(
            [sys.executable, "-c", SHAPES_SCRIPT, mode], capture_output=True, text=True, timeout=300, env=env
        )
        assert r.returncode == 0, r.stderr
        return float(r.stdout.split()[-1])

    capped, default = growth("platform"), growth("torch")
    assert capped < 0.7 * default, (capped, default)
