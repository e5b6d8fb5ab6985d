"""Layers grouped by their KV cache spec (vLLM's vllm/v1/core/kv_cache_utils.py does the same
for its hybrid allocator): the pool is sized and a manager allocates per group, not per layer."""

from __future__ import annotations

from tacit.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec


def get_kv_cache_groups(specs: dict[str, KVCacheSpec]) -> tuple[KVCacheGroupSpec, ...]:
    """{layer name: spec} -> one group per distinct spec, holding its layers in their order;
    groups in the order of their first layer (a model's layers all share one spec today, so
    one group; a later hybrid model, full attention beside a sliding window, gets two)."""
    if not specs:
        raise ValueError("no KV cache layers to group: the model declared none")
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        by_spec.setdefault(spec, []).append(name)
    return tuple(KVCacheGroupSpec(tuple(names), spec) for spec, names in by_spec.items())
