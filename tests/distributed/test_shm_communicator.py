"""The shared-memory communicator against the torch (gloo) reference on 2 and 3 ranks: every
collective, every dtype, sizes from one element to many times its buffer (chunking), both
all-reduce algorithms, async ops, thousands of consecutive collectives, the C entry point, and
a peer that dies mid-collective (an error naming it within seconds, never a hang)."""

from __future__ import annotations

import ctypes
import os
import time

import pytest
import torch
import torch.multiprocessing as mp

from tacit.distributed.shm_kernels import load_shm_kernels

pytestmark = pytest.mark.skipif(load_shm_kernels() is None, reason="the shm communicator's C++ did not build")

# A 16 KiB buffer, so a few thousand elements already take several chunks (all_to_all and
# reduce_scatter split it in world regions: 8 KiB or 5.3 KiB per chunk).
BUF = 16 << 10
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NUMELS = [1, 7, 1000, 20011]  # 20011 fp32 = 80 KB: 5+ chunks, and not a multiple of anything


def _input(rank: int, numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * seed + 10 * rank + 1)
    return torch.randn(numel, generator=g).to(dtype)


def _rank_order_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """What the shm all-reduce promises: the fp32 sum in rank order, rounded once."""
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc.to(parts[0].dtype)


def _a2a_splits(rank: int, world: int, scale: int) -> tuple[list[int], list[int]]:
    """Uneven, with zero-row splits: rank r sends ((r + p) % 3) * scale rows to rank p."""
    return [((p + rank) % 3) * scale for p in range(world)], [((rank + p) % 3) * scale for p in range(world)]


def _collectives(rank: int, world: int) -> dict:
    from tacit.distributed.shm_communicator import ShmCommunicator
    from tacit.distributed.torch_communicator import TorchCommunicator

    ref = TorchCommunicator()
    one_shot = ShmCommunicator(buffer_bytes=BUF, two_shot_min_bytes=1 << 40, timeout_s=20)
    two_shot = ShmCommunicator(buffer_bytes=BUF, two_shot_min_bytes=0, chunk_bytes=4096, timeout_s=20)
    out: dict = {"leaked": os.path.exists("/dev/shm" + one_shot.segment_name)}
    for dtype in DTYPES:
        for numel in NUMELS:
            x = _input(rank, numel, dtype)
            key = (str(dtype), numel)
            out["ar1", key] = one_shot.all_reduce(x.clone())
            out["ar2", key] = two_shot.all_reduce(x.clone())
            out["ar_gloo", key] = ref.all_reduce(x.clone())
            rs = _input(rank, numel * world, dtype, seed=1).reshape(world, numel)
            out["rs0", key] = one_shot.reduce_scatter(rs)
            out["rs1", key] = one_shot.reduce_scatter(rs.t().contiguous(), dim=1)
    for dtype in DTYPES + [torch.int64]:
        x = _input(rank, 3 * 2000, torch.float32).to(dtype).reshape(2000, 3)
        for dim in (0, 1):
            out["ag", str(dtype), dim] = (one_shot.all_gather(x, dim=dim), ref.all_gather(x, dim=dim))
    for scale in (1, 700):  # 700 rows of 5 fp32 each = 14 KB per split: several rounds
        ins, outs = _a2a_splits(rank, world, scale)
        x = _input(rank, sum(ins) * 5, torch.float32, seed=2).reshape(sum(ins), 5)
        out["a2a", scale] = (one_shot.all_to_all(x, outs, ins), ref.all_to_all(x, outs, ins))
    # send/recv around the ring; the send is async since a message over one chunk (16 KiB) waits
    # for its receiver, and every rank sends first.
    for numel in (3, 10000):
        msg = _input(rank, numel, torch.float32, seed=3)
        got = torch.empty(numel)
        handle = one_shot.send(msg, (rank + 1) % world, async_op=True)
        one_shot.recv(got, (rank - 1) % world)
        handle.wait()
        out["p2p", numel] = got
    # async: issued together, run in issue order on the communicator's thread.
    a, b = _input(rank, 5000, torch.float32, seed=4), _input(rank, 3, torch.bfloat16, seed=5)
    handles = [
        two_shot.all_reduce(a.clone(), async_op=True),
        two_shot.all_gather(b, async_op=True),
        two_shot.reduce_scatter(a[: 1000 * world].clone(), async_op=True),
    ]
    sync_after = two_shot.all_reduce(b.clone())  # a synchronous call queues behind them
    out["async"] = [h.wait() for h in handles] + [sync_after]
    out["async_sync"] = [ref.all_reduce(a.clone()), ref.all_gather(b), None, None]
    # Thousands of consecutive collectives: the slots alternate by parity with no extra barrier.
    bad = 0
    for i in range(3000):
        t = torch.full((4,), float(rank + i))
        one_shot.all_reduce(t)
        bad += int(t[0].item() != world * i + world * (world - 1) / 2)
    out["consecutive_bad"] = bad
    # The C entry point, as a fused C++ decode step would call it.
    fn = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_char_p, ctypes.c_int64
    )(two_shot.all_reduce_fn_ptr())
    c = _input(rank, 999, torch.bfloat16, seed=6)
    out["c_abi_rc"] = fn(two_shot.ctx_ptr(), c.data_ptr(), c.numel(), 1, None, 0)
    out["c_abi"] = c
    errors = []
    for bad_call in (
        lambda: one_shot.all_reduce(torch.zeros(4, dtype=torch.int64)),
        lambda: one_shot.all_reduce(torch.zeros(4, 4).t()),
    ):
        try:
            bad_call()
        except ValueError as e:
            errors.append(str(e))
    out["errors"] = errors
    one_shot.barrier()
    one_shot.close()
    two_shot.close()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_equals_gloo(world):
    results = run_collectives(world)
    for rank, out in enumerate(results):
        assert not out["leaked"], "the segment's name was not unlinked"
        for dtype in DTYPES:
            for numel in NUMELS:
                key = (str(dtype), numel)
                exact = _rank_order_sum([_input(r, numel, dtype) for r in range(world)])
                # Both algorithms: bit-equal to the fp32 rank-order sum rounded once.
                assert torch.equal(out["ar1", key], exact), key
                assert torch.equal(out["ar2", key], exact), key
                # gloo sums in its own order (and bf16/fp16 in their own precision): close.
                tol = 1e-5 if dtype == torch.float32 else 2e-2
                torch.testing.assert_close(out["ar1", key], out["ar_gloo", key], rtol=tol, atol=tol)
                full = _rank_order_sum(
                    [_input(r, numel * world, dtype, seed=1).reshape(world, numel) for r in range(world)]
                )
                assert torch.equal(out["rs0", key], full[rank : rank + 1]), key
                assert torch.equal(out["rs1", key], full.t()[:, rank : rank + 1]), key
        for dtype in DTYPES + [torch.int64]:
            for dim in (0, 1):
                shm, gloo = out["ag", str(dtype), dim]
                assert torch.equal(shm, gloo), (dtype, dim)
        for scale in (1, 700):
            shm, gloo = out["a2a", scale]
            assert torch.equal(shm, gloo), scale
        for numel in (3, 10000):
            assert torch.equal(out["p2p", numel], _input((rank - 1) % world, numel, torch.float32, seed=3))
        got, want = out["async"], out["async_sync"]
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[1], want[1])
        a = [_input(r, 5000, torch.float32, seed=4)[: 1000 * world] for r in range(world)]
        assert torch.equal(got[2], _rank_order_sum(a)[rank * 1000 : (rank + 1) * 1000])
        assert torch.equal(got[3], _rank_order_sum([_input(r, 3, torch.bfloat16, seed=5) for r in range(world)]))
        assert out["consecutive_bad"] == 0
        assert out["c_abi_rc"] == 0
        assert torch.equal(
            out["c_abi"], _rank_order_sum([_input(r, 999, torch.bfloat16, seed=6) for r in range(world)])
        )
        assert "int64" in out["errors"][0] and "not contiguous" in out["errors"][1]


def run_collectives(world: int) -> list[dict]:
    from tacit.distributed.spawn import run_on_ranks

    return run_on_ranks(_collectives, world)


def _dies(rank: int, world: int, init_file: str, results) -> None:
    """The last rank exits once the communicator is up; the others all_reduce and report."""
    from tacit.distributed.shm_communicator import ShmCommunicator
    from tacit.distributed.spawn import init_rank

    init_rank(rank, world, init_file)
    comm = ShmCommunicator(buffer_bytes=BUF)
    comm.all_reduce(torch.ones(8))  # all ranks are up and in step
    if rank == world - 1:
        os._exit(0)  # a zombie until the test reaps it: kill(pid, 0) alone would call it alive
    t0 = time.monotonic()
    try:
        comm.all_reduce(torch.ones(1 << 16))
        msg = "no error"
    except RuntimeError as e:
        msg = str(e)
    results.put((rank, msg, time.monotonic() - t0))
    results.close()
    results.join_thread()
    os._exit(0)  # gloo's teardown would wait for the dead rank


@pytest.mark.parametrize("world", [2, 3])
def test_a_dead_peer_is_an_error_naming_it_within_seconds(world, tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    init_file = str(tmp_path / "rendezvous")
    procs = [ctx.Process(target=_dies, args=(r, world, init_file, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        reports = [results.get(timeout=60) for _ in range(world - 1)]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    dead = world - 1
    for rank, msg, elapsed in reports:
        assert f"rank {dead}" in msg and "exited" in msg, (rank, msg)
        assert elapsed < 10, (rank, elapsed)


def _disagree(rank: int, world: int) -> str:
    from tacit.distributed.shm_communicator import ShmCommunicator

    try:
        ShmCommunicator(buffer_bytes=BUF, two_shot_min_bytes=1024 * (rank + 1))
    except RuntimeError as e:
        return str(e)
    return "no error"


def test_ranks_that_disagree_on_the_algorithm_are_refused_at_construction():
    from tacit.distributed.spawn import run_on_ranks

    for msg in run_on_ranks(_disagree, 2):
        assert "disagree" in msg and "rank 0 (16384, 1024" in msg and "rank 1 (16384, 2048" in msg, msg
