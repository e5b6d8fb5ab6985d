"""Layers grouped by their KV cache spec (vLLM's vllm/v1/core/kv_cache_utils.py does the same
for its hybrid allocator): the pool is sized and a manager allocates per group, not per layer."""

from __future__ import annotations

from tacit.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    check_shareable,
    window_of,
)


def get_kv_cache_groups(specs: dict[str, KVCacheSpec]) -> tuple[KVCacheGroupSpec, ...]:
    """{layer name: spec} -> groups of layers of one spec, in the order of their first layer.

    Kinds that all keep every token: one group per spec (one block table serves them). With a
    sliding window among them (a hybrid model): every
    group has the size of the smallest spec's layer count, the larger specs' layers cut into
    groups of that size in order, because groups share cache tensors (tacit/kv_cache_interface.py):
    gpt-oss's 12 sliding and 12 full layers make two groups of 12; Gemma 3 1B's 22 sliding and 4
    full make five sliding groups of 4, one of 2 and one full group of 4 (a block id's page in
    the two unused tensors of the group of 2 is the price of one shared pool)."""
    if not specs:
        raise ValueError("no KV cache layers to group: the model declared none")
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        by_spec.setdefault(spec, []).append(name)
    if len(by_spec) == 1 or all(window_of(spec) is None for spec in by_spec):
        # Every kind keeps every token: one group per spec, one block table for all of them.
        groups = tuple(KVCacheGroupSpec(tuple(names), spec) for spec, names in by_spec.items())
        check_shareable(groups)
        return groups
    size = min(len(names) for names in by_spec.values())
    groups = tuple(
        KVCacheGroupSpec(tuple(names[i : i + size]), spec)
        for spec, names in by_spec.items()
        for i in range(0, len(names), size)
    )
    check_shareable(groups)
    return groups


def window_groups(windows: list[int | None], full: FullAttentionSpec) -> tuple[KVCacheGroupSpec, ...]:
    """The groups of a model whose layers all have `full`'s shape and these sliding windows
    (config/model.py layer_sliding_windows), without building it: what a benchmark or a test sizes
    a pool by."""
    specs = {
        f"layer{i}": full if w is None else SlidingWindowSpec(**{**vars(full), "sliding_window": w})
        for i, w in enumerate(windows)
    }
    return get_kv_cache_groups(specs)
