"""The reference communicator on 2 and 3 gloo ranks: each collective against its definition."""

import pytest
import torch

from tacit.distributed.spawn import run_on_ranks
from tacit.distributed.torch_communicator import TorchCommunicator


def _rank_tensor(rank: int, rows: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(rows, 5, generator=g).to(dtype)


def _collectives(rank: int, world: int) -> dict:
    comm = TorchCommunicator()
    out = {}
    t = _rank_tensor(rank, 6)
    out["all_reduce"] = comm.all_reduce(t.clone())
    out["all_reduce_async"] = comm.all_reduce(t.clone(), async_op=True).wait()
    out["all_gather"] = comm.all_gather(t, dim=0)
    out["all_gather_dim1"] = comm.all_gather(t, dim=1, async_op=True).wait()
    out["reduce_scatter"] = comm.reduce_scatter(_rank_tensor(rank, 6 * world))
    # Uneven: rank r sends (peer + r + 1) rows to each peer.
    in_splits = [p + rank + 1 for p in range(world)]
    out_splits = [rank + p + 1 for p in range(world)]
    out["all_to_all"] = comm.all_to_all(_rank_tensor(rank, sum(in_splits)), out_splits, in_splits)
    if world >= 2:
        if rank == 0:
            comm.send(torch.arange(4.0), 1)
        elif rank == 1:
            out["recv"] = comm.recv(torch.empty(4), 0)
    comm.barrier()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_torch_communicator_collectives(world):
    results = run_on_ranks(_collectives, world)
    inputs = [_rank_tensor(r, 6) for r in range(world)]
    total = sum(inputs)
    for rank, out in enumerate(results):
        torch.testing.assert_close(out["all_reduce"], total)
        torch.testing.assert_close(out["all_reduce_async"], total)
        torch.testing.assert_close(out["all_gather"], torch.cat(inputs, 0))
        torch.testing.assert_close(out["all_gather_dim1"], torch.cat(inputs, 1))
        big = sum(_rank_tensor(r, 6 * world) for r in range(world))
        torch.testing.assert_close(out["reduce_scatter"], big[rank * 6 : (rank + 1) * 6])
        expect = []
        for src in range(world):
            sent = _rank_tensor(src, sum(p + src + 1 for p in range(world)))
            start = sum(p + src + 1 for p in range(rank))
            expect.append(sent[start : start + rank + src + 1])
        torch.testing.assert_close(out["all_to_all"], torch.cat(expect))
    torch.testing.assert_close(results[1]["recv"], torch.arange(4.0))


def _bad_split(rank: int, world: int) -> str:
    comm = TorchCommunicator()
    try:
        comm.all_to_all(torch.zeros(4, 2), [2, 2], [1, 1])
    except ValueError as e:
        return str(e)
    return "no error"


def test_all_to_all_refuses_splits_that_do_not_cover_the_rows():
    msgs = run_on_ranks(_bad_split, 2)
    assert all("input_split_sizes=[1, 1]" in m and "4 rows" in m for m in msgs)


def _accelerator_communicator(rank: int, world: int) -> tuple:
    from types import SimpleNamespace

    import torch.distributed as dist

    from tacit.worker.rank import make_communicator

    # An accelerator platform as make_communicator sees it (its default communicator and the
    # backend of its data path); gloo stands in for NCCL so that this runs on CPU.
    comm = make_communicator(SimpleNamespace(default_communicator="torch", communicator_backend="gloo"))
    t = torch.tensor([rank + 1.0])
    comm.all_reduce(t)
    return comm.group is not None and comm.group is not dist.group.WORLD, dist.get_backend(comm.group), t.item()


def test_accelerator_ranks_communicate_on_a_group_of_their_platforms_backend():
    """On GPUs the collectives go through an NCCL group of their own, not the gloo world group
    (which carries the engine's CPU-side control messages)."""
    assert run_on_ranks(_accelerator_communicator, 2) == [(True, "gloo", 3.0)] * 2
