"""The prefix cache's second tier (--kv-offloading-size, --kv-offloading-dir): blocks evicted from
the pool are stored below it and loaded back on a hit instead of being recomputed, in host
memory or in files that a restarted engine finds. Float32 greedy: the tokens are exactly the
ones without any cache, and the tokens loaded are exactly the tokens not computed."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from counted_steps import GREEDY, one_by_one
from safetensors.torch import load_file, save_file

from tacit import LLM
from tacit.config.engine_args import EngineArgs
from tacit.engine.metrics import ServingMetrics
from tacit.loader import open_model
from tacit.memory.block_hash import extend_block_hashes
from tacit.memory.kv_offload import KVOffloadIndex
from tacit.platforms import get_platform
from tacit.worker.model_fingerprint import model_fingerprint

SHARED = list(range(20, 30))  # 10 tokens: with 4-token blocks, 2 full blocks and half a third
PROMPT = SHARED + [40, 41, 42]  # 13 tokens: 3 full blocks a hit may cover (never the last token's)
OTHERS = [[90 + i] * 20 for i in range(3)]  # 5 full blocks each: a pool of 8 evicts PROMPT's blocks
TIER = 1 / 64  # GiB: far more than the tiny models' blocks need


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _plain(path, prompts):
    llm = LLM(str(path), dtype="float32", block_size=4, enable_prefix_caching=False)
    return _tokens(one_by_one(llm, prompts)[0])


@pytest.mark.parametrize("arch,kw", [("llama", {}), ("llama", {"kv_cache_dtype": "int8"}), ("deepseek_v3", {})])
def test_evicted_blocks_come_back_from_the_host_tier(tiny_model_factory, arch, kw):
    _, _, path = tiny_model_factory(arch)
    sequence = [PROMPT, *OTHERS, PROMPT]
    llm = LLM(str(path), dtype="float32", block_size=4, num_kv_blocks=8, kv_offloading_size=TIER, **kw)
    got, computed = one_by_one(llm, sequence)
    assert _tokens(got) == _plain(path, sequence)
    # The pool lost PROMPT's blocks to the others; the tier gave all 3 back, none recomputed.
    assert got[-1].num_cached_tokens == 12
    assert computed[-1] == computed[0] - 12
    stats = llm.engine.get_stats()
    assert stats.external_prefix_cache_hits == 12
    assert stats.kv_offload_loaded == 3
    assert stats.kv_offload_stored >= 3
    text = ServingMetrics(snapshot=stats).render_prometheus("m")
    assert 'vllm:external_prefix_cache_hits_total{model_name="m",engine="0"} 12' in text
    assert 'tacit_kv_offload_hits_total{model_name="m"} 12' in text
    assert 'tacit_kv_offload_loaded_total{model_name="m"} 3' in text


def test_without_the_tier_the_same_eviction_recomputes(tiny_model_factory):
    """The control of the test above: the same pool without a tier finds nothing."""
    _, _, path = tiny_model_factory("llama")
    llm = LLM(str(path), dtype="float32", block_size=4, num_kv_blocks=8)
    got, _ = one_by_one(llm, [PROMPT, *OTHERS, PROMPT])
    assert got[-1].num_cached_tokens == 0


def test_a_full_tier_keeps_its_most_recently_used_blocks(tiny_model_factory):
    """A tier of 3 blocks: the first prompt's blocks are pushed out of it by the later ones'."""
    _, _, path = tiny_model_factory("llama")
    probe = LLM(str(path), dtype="float32", block_size=4, num_kv_blocks=8)
    bytes_per_block = probe.engine.kv_cache_config.bytes_per_block
    llm = LLM(
        str(path), dtype="float32", block_size=4, num_kv_blocks=8, kv_offloading_size=3 * bytes_per_block / (1 << 30)
    )
    sequence = [PROMPT, *OTHERS, PROMPT]
    got, _ = one_by_one(llm, sequence)
    assert _tokens(got) == _plain(path, sequence)
    assert llm.engine.get_stats().kv_offload_blocks == 3
    assert got[-1].num_cached_tokens == 0


def test_a_restart_finds_the_prefix_on_disk(tiny_model_factory, tmp_path):
    _, _, path = tiny_model_factory("llama")
    first = LLM(str(path), dtype="float32", block_size=4, kv_offloading_size=TIER, kv_offloading_dir=str(tmp_path))
    one_by_one(first, [PROMPT])
    first.shutdown()  # saves the pool's cached blocks to the tier
    # 13 prompt tokens and 5 computed output tokens: 4 full blocks.
    assert len(list(tmp_path.rglob("*.kv"))) == 4
    again = LLM(str(path), dtype="float32", block_size=4, kv_offloading_size=TIER, kv_offloading_dir=str(tmp_path))
    prompts = [SHARED + [50, 51, 52, 53], PROMPT]
    got, computed = one_by_one(again, prompts)
    assert _tokens(got) == _plain(path, prompts)
    # The first finds the 2 shared blocks on disk; the second all 3 (the pool now holds 2 of them).
    assert [o.num_cached_tokens for o in got] == [8, 12]
    assert computed[0] == len(prompts[0]) - 8 + GREEDY.max_tokens - 1
    assert again.engine.get_stats().external_prefix_cache_hits == 8 + 4
    again.shutdown()


def _perturbed_copy(path, dest):
    """The same model with one weight changed: another checkpoint of the same shape."""
    shutil.copytree(path, dest)
    (weights,) = dest.glob("*.safetensors")
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, weights, metadata={"format": "pt"})
    return dest


def test_another_checkpoint_never_reuses_the_disk_tier(tiny_model_factory, tmp_path):
    _, _, path = tiny_model_factory("llama")
    tier = tmp_path / "tier"
    first = LLM(str(path), dtype="float32", block_size=4, kv_offloading_size=TIER, kv_offloading_dir=str(tier))
    one_by_one(first, [PROMPT])
    first.shutdown()
    other = _perturbed_copy(path, tmp_path / "other")
    llm = LLM(str(other), dtype="float32", block_size=4, kv_offloading_size=TIER, kv_offloading_dir=str(tier))
    got, _ = one_by_one(llm, [PROMPT])
    assert got[0].num_cached_tokens == 0
    assert _tokens(got) == _plain(other, [PROMPT])
    llm.shutdown()


@pytest.mark.parametrize(
    "change", [{"dtype": "bfloat16"}, {"kv_cache_dtype": "int8"}, {"block_size": 8}, "weights", "tokenizer"]
)
def test_the_fingerprint_names_what_the_kv_depends_on(tiny_model_factory, tmp_path, change):
    _, _, path = tiny_model_factory("llama")

    def fingerprint(model_path, **kw):
        source = open_model(str(model_path))
        args = EngineArgs(model=str(model_path), **{"dtype": "float32", "block_size": 4, **kw})
        return model_fingerprint(source, args.create_engine_config(source, get_platform("cpu")), "cpu")

    base = fingerprint(path)
    assert fingerprint(path) == base
    if change == "weights":
        assert fingerprint(_perturbed_copy(path, tmp_path / "m")) != base
    elif change == "tokenizer":
        dest = tmp_path / "t"
        shutil.copytree(path, dest)
        spec = json.loads((dest / "tokenizer.json").read_text())
        spec["model"]["merges"].pop()  # one merge fewer: some text tokenizes otherwise
        (dest / "tokenizer.json").write_text(json.dumps(spec))
        assert fingerprint(dest) != base
    else:
        assert fingerprint(path, **change) != base


def test_corrupt_and_truncated_files_are_dropped_with_a_warning(tiny_model_factory, tmp_path, caplog):
    _, _, path = tiny_model_factory("llama")
    first = LLM(str(path), dtype="float32", block_size=4, kv_offloading_size=TIER, kv_offloading_dir=str(tmp_path))
    one_by_one(first, [PROMPT])
    first.shutdown()
    files = {p.name: p for p in tmp_path.rglob("*.kv")}
    assert len(files) == 4
    # The files of the 2nd and 3rd blocks: one truncated, one with a payload byte flipped.
    chain: list[bytes] = []
    extend_block_hashes(chain, PROMPT, 4, None)
    second, third = files[chain[1].hex() + ".kv"], files[chain[2].hex() + ".kv"]
    second.write_bytes(second.read_bytes()[:-7])
    data = bytearray(third.read_bytes())
    data[-1] ^= 0xFF
    third.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="tacit.kv_offload"):
        llm = LLM(str(path), dtype="float32", block_size=4, kv_offloading_size=TIER, kv_offloading_dir=str(tmp_path))
    dropped = " ".join(r.getMessage() for r in caplog.records)
    assert second.name in dropped and "truncated" in dropped
    assert third.name in dropped and "crc32" in dropped
    assert not second.exists() and not third.exists()
    got, _ = one_by_one(llm, [PROMPT])
    assert got[0].num_cached_tokens == 4  # only the first block was still whole
    assert _tokens(got) == _plain(path, [PROMPT])
    llm.shutdown()


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"kv_offloading_size": -1.0}, "kv_offloading_size=-1.0 is invalid"),
        ({"kv_offloading_size": float("nan")}, "kv_offloading_size=nan is invalid"),
        ({"kv_offloading_dir": "/tmp/x"}, "needs kv_offloading_size > 0"),
        ({"kv_offloading_size": 1.0, "enable_prefix_caching": False}, "needs the prefix cache"),
    ],
)
def test_bad_tier_settings_are_refused_naming_them(kw, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(model="unused", **kw).create_cache_config()


def test_data_parallel_attention_refuses_the_tier(tiny_model_factory):
    _, _, path = tiny_model_factory("qwen3")
    with pytest.raises(ValueError, match="kv_offloading_size > 0 with data_parallel_attention"):
        LLM(str(path), dtype="float32", tensor_parallel_size=2, data_parallel_attention=True, kv_offloading_size=1.0)


def test_an_unwritable_directory_is_refused_naming_it(tiny_model_factory, tmp_path):
    _, _, path = tiny_model_factory("llama")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="kv_offloading_dir=.*cannot hold the KV tier"):
        LLM(str(path), dtype="float32", kv_offloading_size=TIER, kv_offloading_dir=str(blocker / "sub"))


def test_the_tier_discards_its_least_recently_used_but_never_a_block_being_loaded():
    tier = KVOffloadIndex(2, held=[b"a", b"b", b"c"])  # the oldest does not fit: discarded
    assert [op.kind for op in tier.take_ops()] == ["discard"]
    assert tier.lookup([b"b", b"c", b"d"], 12, 4) == 2 and tier.hits == 8 and tier.queries == 12
    tier.load([b"b"], [7])
    # Full: "c" makes room for "x", then "x" (not "b", which this step loads) for "y".
    tier.store([(3, b"x"), (4, b"y")])
    ops = [(op.kind, op.block_hash, op.block_id) for op in tier.take_ops()]
    assert ops == [
        ("load", b"b", 7),
        ("discard", b"c", -1),
        ("store", b"x", 3),
        ("discard", b"x", -1),
        ("store", b"y", 4),
    ]
    assert b"b" in tier and b"y" in tier and b"x" not in tier
    tier.save_all([(5, b"x"), (6, b"z")])  # no room: nothing held is discarded for it
    assert tier.take_ops() == []


def test_a_full_disk_keeps_the_blocks_in_memory_and_says_so_once(tiny_model_factory, tmp_path, monkeypatch, caplog):
    """Writes that fail (ENOSPC) leave the tier holding what its index says: the blocks stay in
    host memory, a hit on them still loads them, and one warning names the directory."""
    from tacit.worker import kv_offload_disk

    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kv_offload_disk, "write_block", full)
    _, _, path = tiny_model_factory("llama")
    sequence = [PROMPT, *OTHERS, PROMPT, *OTHERS, PROMPT]
    with caplog.at_level(logging.WARNING, logger="tacit.kv_offload"):
        llm = LLM(
            str(path),
            dtype="float32",
            block_size=4,
            num_kv_blocks=8,
            kv_offloading_size=TIER,
            kv_offloading_dir=str(tmp_path),
        )
        got, _ = one_by_one(llm, sequence)
    assert _tokens(got) == _plain(path, sequence)
    assert [got[4].num_cached_tokens, got[-1].num_cached_tokens] == [12, 12]
    warnings = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path) in warnings[0]
    assert not list(tmp_path.rglob("*.kv"))
