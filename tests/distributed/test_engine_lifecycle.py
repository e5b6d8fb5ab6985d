"""Tensor-parallel engines come and go in one process: a second one while the first lives is
refused with what to do, and an engine whose construction fails at any step releases what that
step set up (worker processes, the process group, the rendezvous file), so the next valid
LLM(...) in the same process works."""

import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest
import torch.distributed as dist

from tacit import LLM, SamplingParams
from tacit.engine.executor import WorkerDiedError
from tests.distributed.test_tensor_parallel import prompts_for

PARAMS = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


def leftovers() -> set[str]:
    """Shared-memory segments and rendezvous files a tensor-parallel engine makes."""
    shm = {f"/dev/shm/{n}" for n in os.listdir("/dev/shm") if n.startswith("tacit-shm-")}
    tmp = tempfile.gettempdir()
    return shm | {f"{tmp}/{n}" for n in os.listdir(tmp) if n.startswith("tacit-tp-")}


@pytest.fixture(autouse=True)
def nothing_left_behind():
    before = leftovers()
    yield
    assert leftovers() <= before


def assert_a_valid_engine_works(path, expected):
    """No process, process group, shared-memory segment or rendezvous file of the failed engine
    is left, and a new tensor-parallel engine in this process answers as one process does."""
    assert not multiprocessing.active_children() and not dist.is_initialized()
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2)
    try:
        assert [o.outputs[0].token_ids for o in llm.generate(expected[0], PARAMS)] == expected[1]
    finally:
        llm.shutdown()
    assert not multiprocessing.active_children() and not dist.is_initialized()


@pytest.fixture(scope="module")
def expected(tiny_llama):
    model, _, path = tiny_llama
    prompts = prompts_for(model.config.vocab_size)[:2]
    return prompts, [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32").generate(prompts, PARAMS)]


def test_a_second_engine_while_the_first_lives_is_refused_with_what_to_do(tiny_llama, expected):
    _, _, path = tiny_llama
    first = LLM(str(path), dtype="float32", tensor_parallel_size=2)
    try:
        with pytest.raises(RuntimeError, match=r"already runs in this process.*\.shutdown\(\)"):
            LLM(str(path), dtype="float32", tensor_parallel_size=2)
        # The refusal touched nothing of the first engine's.
        assert [o.outputs[0].token_ids for o in first.generate(expected[0], PARAMS)] == expected[1]
    finally:
        first.shutdown()
    assert_a_valid_engine_works(path, expected)


def test_engines_built_in_a_loop_after_shutdown(tiny_llama, expected):
    _, _, path = tiny_llama
    for _ in range(2):
        llm = LLM(str(path), dtype="float32", tensor_parallel_size=2)
        assert [o.outputs[0].token_ids for o in llm.generate(expected[0], PARAMS)] == expected[1]
        llm.shutdown()


def test_config_check(tiny_llama, expected):
    _, _, path = tiny_llama
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        LLM(str(path), dtype="float32", tensor_parallel_size=3)
    assert_a_valid_engine_works(path, expected)


def test_worker_start(tiny_llama, expected):
    """The worker killed while it starts (importing torch), before the rendezvous: rank 0 would
    otherwise wait the rendezvous' 30 minutes."""
    _, _, path = tiny_llama
    killed = []

    def kill_the_worker_when_it_appears():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not killed:
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)
                return
            time.sleep(0.005)

    threading.Thread(target=kill_the_worker_when_it_appears, daemon=True).start()
    start = time.monotonic()
    # Reported at once, not after the rendezvous' 30-minute timeout.
    with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid \d+, exit code -9\)"):
        LLM(str(path), dtype="float32", tensor_parallel_size=2)
    assert killed and time.monotonic() - start < 10
    assert_a_valid_engine_works(path, expected)


def test_rendezvous(tiny_llama, expected, monkeypatch):
    """The rendezvous itself fails once the worker is running."""
    import tacit.distributed.spawn as spawn

    def failing_rendezvous(*args, **kwargs):
        raise RuntimeError("rendezvous failed (injected)")

    monkeypatch.setattr(spawn, "init_rank_watching", failing_rendezvous)
    with pytest.raises(RuntimeError, match="injected"):
        LLM(str(path := tiny_llama[2]), dtype="float32", tensor_parallel_size=2)
    monkeypatch.undo()
    assert_a_valid_engine_works(path, expected)


def test_weight_load(tiny_llama, expected, tmp_path):
    """A truncated checkpoint: every rank fails while loading its shard."""
    _, _, path = tiny_llama
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(Exception, match="safetensors|truncated|incomplete|header|size"):
        LLM(str(broken), dtype="float32", tensor_parallel_size=2)
    assert_a_valid_engine_works(path, expected)


def test_kv_allocation(tiny_llama, expected):
    """A KV pool larger than the host's memory is refused before it is allocated."""
    _, _, path = tiny_llama
    with pytest.raises(ValueError, match="num_kv_blocks"):
        LLM(str(path), dtype="float32", tensor_parallel_size=2, num_kv_blocks=1 << 40)
    assert_a_valid_engine_works(path, expected)
