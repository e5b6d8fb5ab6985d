"""Collective time by algorithm and message size, over a node's links and the network between
nodes (HardwareSpec's link_* inside a node, inter_node_* across; link_* where those are None).

Every formula is bytes over the bandwidth of the link it crosses plus steps times that link's
latency. `message_bytes` is the tensor one rank holds (all-reduce) or the whole gathered /
scattered tensor (all-gather, reduce-scatter), as the operator model counts them. A group of N
ranks is placed on consecutive devices: it spans ceil(N / K) nodes of K devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALL_REDUCE = ("ring", "tree", "one_shot", "two_shot")
# Inside a node, vLLM's custom all-reduce and NCCL's NVLS use one-shot / two-shot; over the network
# only ring and tree exist (they need peer memory, which InfiniBand does not give)
INTRA_ONLY = ("one_shot", "two_shot")


@dataclass(frozen=True)
class Link:
    bandwidth: float  # bytes/s one device sends, one direction
    latency: float  # seconds a step


def ring_all_reduce(m: float, n: int, link: Link) -> float:
    """Ring: reduce-scatter then all-gather, 2(N-1) steps, 2(N-1)/N * M bytes over each link."""
    return 2 * (n - 1) / n * m / link.bandwidth + 2 * (n - 1) * link.latency


def tree_all_reduce(m: float, n: int, link: Link) -> float:
    """NCCL's double binary tree: reduce up and broadcast down, 2 * ceil(log2 N) steps; each
    tree carries half the message, pipelined, so a rank sends about M in each phase: 2M bytes."""
    return 2 * m / link.bandwidth + 2 * math.ceil(math.log2(n)) * link.latency


def one_shot_all_reduce(m: float, n: int, link: Link) -> float:
    """One-shot (vLLM's custom all-reduce, 1 stage): every rank reads the N-1 others' whole
    buffers and sums locally, one step (its barrier) and (N-1) * M bytes over its link."""
    return (n - 1) * m / link.bandwidth + link.latency


def two_shot_all_reduce(m: float, n: int, link: Link) -> float:
    """Two-shot (vLLM's 2-stage custom all-reduce): each rank reduces its 1/N by reading it from
    the others, then all read the reduced pieces: 2 steps, 2(N-1)/N * M bytes."""
    return 2 * (n - 1) / n * m / link.bandwidth + 2 * link.latency


def ring_gather(m: float, n: int, link: Link) -> float:
    """All-gather or reduce-scatter of an M-byte whole tensor, ring: N-1 steps, (N-1)/N * M."""
    return (n - 1) / n * m / link.bandwidth + (n - 1) * link.latency


def pairwise_all_to_all(m: float, n: int, link: Link) -> float:
    """All-to-all of a rank's M bytes, pairwise: N-1 steps, (N-1)/N * M leave each rank."""
    return (n - 1) / n * m / link.bandwidth + (n - 1) * link.latency


_ALL_REDUCE_FNS = {
    "ring": ring_all_reduce,
    "tree": tree_all_reduce,
    "one_shot": one_shot_all_reduce,
    "two_shot": two_shot_all_reduce,
}


def all_reduce_seconds(m: float, n: int, intra: Link, inter: Link, per_node: int, algorithm: str = "auto") -> float:
    """An all-reduce of M bytes a rank over N ranks, K = per_node a node. Inside one node: the
    algorithm asked for, or under "auto" the fastest for this message (one-shot wins small
    messages, where its one step beats the ring's 2(N-1); two-shot or ring large ones, as
    vLLM's custom all-reduce and NCCL's tuner choose). Across nodes: hierarchical (reduce-
    scatter inside the node, an all-reduce of M/K between the nodes, all-gather inside), or a
    flat ring / tree whose every step crosses the slowest link, the inter-node one; "auto"
    takes the fastest, a forced algorithm its flat form."""
    if n <= 1:
        return 0.0
    if algorithm != "auto" and algorithm not in _ALL_REDUCE_FNS:
        raise ValueError(f"all-reduce algorithm {algorithm!r} is not known; valid: auto, {', '.join(ALL_REDUCE)}")
    if n <= per_node:
        if algorithm != "auto":
            return _ALL_REDUCE_FNS[algorithm](m, n, intra)
        return min(f(m, n, intra) for f in _ALL_REDUCE_FNS.values())
    if algorithm != "auto":
        return _ALL_REDUCE_FNS[algorithm](m, n, inter)
    return min(
        hierarchical_all_reduce(m, n, intra, inter, per_node),
        *(f(m, n, inter) for f in (ring_all_reduce, tree_all_reduce)),
    )


def hierarchical_all_reduce(m: float, n: int, intra: Link, inter: Link, per_node: int) -> float:
    """Across ceil(N/K) nodes: reduce-scatter inside each node (K-1 steps, (K-1)/K * M), the
    nodes all-reduce their M/K shards over the network (the faster of ring and tree), then
    all-gather inside the node: 2 * ring_gather(M, K) + all_reduce(M/K, nodes) on inter."""
    k, nodes = per_node, math.ceil(n / per_node)
    inside = 2 * ring_gather(m, k, intra) if k > 1 else 0.0
    return inside + min(ring_all_reduce(m / k, nodes, inter), tree_all_reduce(m / k, nodes, inter))


def gather_seconds(m: float, n: int, intra: Link, inter: Link, per_node: int) -> float:
    """All-gather / reduce-scatter of an M-byte whole tensor: a ring inside a node; across nodes
    the faster of a flat ring at the network's figures and the hierarchical form: each device
    gathers the shards of its counterparts in the other nodes over the network (a ring of the
    nodes over M/K: (nodes-1)/nodes * M/K bytes), then the node's K devices gather inside
    (ring_gather of M over K); a reduce-scatter runs the same steps backwards."""
    if n <= 1:
        return 0.0
    if n <= per_node:
        return ring_gather(m, n, intra)
    nodes = math.ceil(n / per_node)
    hier = ring_gather(m / per_node, nodes, inter) + ring_gather(m, per_node, intra)
    return min(ring_gather(m, n, inter), hier)


def all_to_all_seconds(m: float, n: int, intra: Link, inter: Link, per_node: int) -> float:
    """All-to-all of a rank's M bytes (each destination its 1/N): pairwise inside a node; across
    nodes the bytes for other nodes cross the network while the node's own go over its links,
    at once: max of the two, with N-1 steps at the network's latency."""
    if n <= 1:
        return 0.0
    if n <= per_node:
        return pairwise_all_to_all(m, n, intra)
    local = (per_node - 1) / n * m / intra.bandwidth
    remote = (n - per_node) / n * m / inter.bandwidth
    return max(local, remote) + (n - 1) * inter.latency


def direct_send_seconds(total: float, inter_bytes: float, steps: float, intra: Link, inter: Link) -> float:
    """Messages a rank sends at once to chosen peers (DeepEP's dispatch and combine, a pipeline
    stage's send): those inside the node over its links while the rest cross the network, so
    the slower of the two, plus `steps` latencies of the slowest link used."""
    local = (total - inter_bytes) / intra.bandwidth
    remote = inter_bytes / inter.bandwidth
    latency = inter.latency if inter_bytes > 0 else intra.latency
    return max(local, remote) + steps * latency


def collective_seconds(
    kind: str,
    message_bytes: float,
    ranks: int,
    intra: Link,
    inter: Link | None = None,
    per_node: int = 0,
    algorithm: str = "auto",
) -> float:
    """One collective of `message_bytes` among `ranks` (per_node 0: every rank in one node)."""
    inter = inter or intra
    k = per_node or max(ranks, 1)
    if kind == "all_reduce":
        return all_reduce_seconds(message_bytes, ranks, intra, inter, k, algorithm or "auto")
    if kind in ("all_gather", "reduce_scatter"):
        return gather_seconds(message_bytes, ranks, intra, inter, k)
    if kind == "all_to_all":
        return all_to_all_seconds(message_bytes, ranks, intra, inter, k)
    raise ValueError(f"collective {kind!r} is not known; valid: all_reduce, all_gather, reduce_scatter, all_to_all")
