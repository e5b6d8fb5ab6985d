"""`tacit predict`'s workload and output: the decode step at --context, --input-len 0, the batch's
TTFT from the engine's scheduler (chunked prefill), MTP drafts, and --json's rows."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import pytest

from tacit.cli import main
from tacit.config import SchedulerConfig
from tacit.perf_model.efficiency import load_profile
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.operators import StepShape, step_ops
from tacit.perf_model.predict import Workload, fitted_roofs, predict
from tacit.perf_model.speculative import draft_forward
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_seconds
from tacit.platforms.hardware_table import get_hardware_spec

H100 = get_hardware_spec("h100-sxm")


def _run(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    return buf.getvalue()


def _pricing(shape, spec=H100) -> Pricing:
    profile = load_profile(spec.efficiency_profile)
    return Pricing(shape, fitted_roofs(spec, profile), profile)


def test_context_prices_the_step_at_that_context():
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    mean = predict(shape, H100, Workload(4, 256, 64))
    assert mean.decode_context == 256 + 31 and not mean.at_context
    at = predict(shape, H100, Workload(4, 256, 64, context=287))
    assert at.decode_step_s == mean.decode_step_s and at.tpot_s == mean.tpot_s
    assert at.at_context and at.throughput_tok_s == pytest.approx(4 / at.tpot_s)  # the step's own rate
    longer = predict(shape, H100, Workload(4, 256, 64, context=8192))
    assert longer.decode_step_s > at.decode_step_s and longer.memory.kv_cache > at.memory.kv_cache
    for bad, message in (
        ({"context": -1}, "context must be >= 0"),
        ({"context": 100}, "context=100 is shorter than input_len=256"),
    ):
        with pytest.raises(ValueError, match=message):
            Workload(4, 256, 64, **bad)


def test_input_zero_decodes_from_the_context_without_a_prefill(tmp_path):
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    with pytest.raises(ValueError, match="input_len=0 .no prefill. needs context >= 1"):
        Workload(4, 0, 16)
    with pytest.raises(ValueError, match="input_len must be >= 0"):
        Workload(4, -1, 16, context=10)
    none = predict(shape, H100, Workload(4, 0, 16, context=1024))
    after = predict(shape, H100, Workload(4, 1024, 16, context=1024))
    assert none.ttft is None and none.ttft_s == 0.0 and none.prefill_ops == []
    assert none.decode_step_s == after.decode_step_s
    assert none.memory.kv_cache == pytest.approx(after.memory.kv_cache)  # 1024 + 16 tokens each way
    out_json = tmp_path / "p.json"
    argv = ["predict", "--model", "random:qwen3-100m", "--hardware", "h100-sxm", "--input-len", "0"]
    out = _run([*argv, "--context", "1024", "--json", str(out_json)])
    assert "TTFT        none: no prefill (--input-len 0)" in out and "at context 1024" in out
    d = json.loads(out_json.read_text())
    assert d["ttft_ms"] is None and d["prefill_ops"] == [] and d["decode_step_ms"] > 0
    assert main(argv) == 2  # input 0 without --context: refused by name
    html = tmp_path / "p.html"
    _run([*argv, "--context", "1024", "--html", str(html)])
    assert "none (no prefill)" in html.read_text() and "<h3>prefill step" not in html.read_text()


def test_ttft_is_the_one_step_when_the_budget_covers_the_batch_and_chunks_when_it_does_not():
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    p = _pricing(shape)
    whole = mixed_step_seconds(p, MixedStep([Chunk(128, 0, True)] * 4))
    covered = predict(shape, H100, Workload(4, 128, 8, scheduler=SchedulerConfig(max_num_batched_tokens=2048)))
    assert covered.ttft.mean_s == pytest.approx(whole) and covered.ttft.max_s == pytest.approx(whole)
    assert covered.ttft.prefill_steps == 1 and covered.prefill_step_s == pytest.approx(whole)
    # 256 tokens a step: prompts 1 and 2 whole in step 1; step 2 decodes them and prefills
    # prompt 3 and 254 of prompt 4; step 3 decodes three and prefills prompt 4's last 2.
    t1 = whole_2 = mixed_step_seconds(p, MixedStep([Chunk(128, 0, True)] * 2))
    t2 = mixed_step_seconds(p, MixedStep([Chunk(1, 128, True)] * 2 + [Chunk(128, 0, True), Chunk(126, 0, False)]))
    t3 = mixed_step_seconds(p, MixedStep([Chunk(1, 129, True)] * 2 + [Chunk(1, 128, True), Chunk(2, 126, True)]))
    chunked = predict(shape, H100, Workload(4, 128, 8, scheduler=SchedulerConfig(max_num_batched_tokens=256)))
    expected = [whole_2, whole_2, t1 + t2, t1 + t2 + t3]
    assert chunked.ttft.mean_s == pytest.approx(sum(expected) / 4)
    assert chunked.ttft.max_s == pytest.approx(expected[-1]) and chunked.ttft.prefill_steps == 3
    assert chunked.ttft.mean_s > covered.ttft.mean_s
    assert chunked.prefill_step_s == covered.prefill_step_s  # the one-step figure stays for old readers


def test_a_prefix_hit_shifts_every_chunk_by_the_cached_tokens():
    shape = shape_from_hf(load_hf_config("random:qwen3-100m"))
    warm = predict(shape, H100, Workload(2, 1000, 8, prefix_hit_rate=0.9))
    assert warm.ttft.mean_s == pytest.approx(
        mixed_step_seconds(_pricing(shape), MixedStep([Chunk(100, 900, True)] * 2))
    )


def test_json_echoes_the_inputs_and_its_operator_rows_sum_to_the_steps(tmp_path):
    out = tmp_path / "p.json"
    _run(
        ["predict", "--model", "Qwen3-30B-A3B", "--hardware", "h200-sxm", "--tensor-parallel-size", "4",
         "--expert-parallel", "--batch-size", "8", "--input-len", "512", "--max-num-batched-tokens", "1024",
         "--json", str(out)]
    )  # fmt: skip
    d = json.loads(out.read_text())
    for key in (
        "ttft_ms", "tpot_ms", "decode_step_ms", "throughput_tok_s", "throughput_tok_s_per_device", "prefill_tok_s",
        "memory_per_device_gb", "fits", "devices", "nodes", "inputs", "prefill_ops", "decode_ops", "memory",
        "bottlenecks", "prefill_step_ms", "ttft", "hardware", "model",
    ):  # fmt: skip
        assert key in d, key
    assert d["inputs"]["batch_size"] == 8 and d["inputs"]["max_num_batched_tokens"] == 1024
    assert d["inputs"]["tensor_parallel_size"] == 4 and d["inputs"]["expert_parallel"] is True
    assert d["hardware"]["name"] == "h200-sxm" and d["hardware"]["description"]
    assert d["model"] == {"name": "Qwen3-30B-A3B", "architecture": "Qwen3MoeForCausalLM"}
    assert d["devices"] == 4 and d["nodes"] == -(-4 // d["hardware"]["devices_per_node"])
    assert d["throughput_tok_s_per_device"] == pytest.approx(d["throughput_tok_s"] / 4)
    assert d["ttft"]["prefill_steps"] >= 8 * 512 // 1024 and d["ttft"]["max_num_batched_tokens"] == 1024
    assert d["ttft_ms"] == pytest.approx(d["ttft"]["mean"]) and d["ttft"]["max"] > d["prefill_step_ms"]
    for phase in ("prefill", "decode"):
        rows = d[f"{phase}_ops"]
        assert {"name", "class", "ms", "compute_ms", "memory_ms", "flops", "bytes", "bound"} <= set(rows[0])
        total = sum(r["ms"] for r in rows) + d[f"{phase}_fixed_overhead_ms"]
        assert total == pytest.approx(d[f"{phase}_step_ms"])
    mem = d["memory"]
    assert mem["total"] == pytest.approx(mem["weights"] + mem["kv_cache"] + mem["activations"])
    assert mem["total"] / 1e9 == pytest.approx(d["memory_per_device_gb"]) and mem["fits"] is d["fits"]
    assert mem["fits"] is (mem["total"] <= mem["capacity"])


def test_mtp_drafts_run_the_model_s_moe_layer_and_the_head():
    """DeepSeek-V3's MTP layer is a MoE layer (models/deepseek_mtp.py): a one-row draft reads the
    experts one of the target's MoE layers reads at that batch, and the head; a dense model's
    MTP layer is dense."""
    v3 = shape_from_hf(load_hf_config("DeepSeek-V3"))
    p = _pricing(v3, get_hardware_spec("h200-sxm"))
    batch, ctx = 8, 2048
    _, times = draft_forward(p, [Chunk(1, ctx, True)] * batch)
    by_class = {t.op.op_class for t in times}
    assert "experts" in by_class and "dense_mlp" not in by_class and "lm_head" in by_class
    target = {op.name: op for op in step_ops(v3, StepShape(batch, 1, ctx))}
    draft = {t.op.name: t.op for t in times}
    assert draft["experts"].bytes == pytest.approx(target["experts"].bytes / v3.num_moe_layers)
    assert draft["lm_head"].bytes == pytest.approx(target["lm_head"].bytes)
    dense = shape_from_hf(load_hf_config("Llama-3.1-8B"))
    _, dense_times = draft_forward(_pricing(dense), [Chunk(1, ctx, True)] * batch)
    assert "dense_mlp" in {t.op.op_class for t in dense_times}
    # k = 2 at acceptance 0.8 (2.44 tokens a verify): the first forward over 2-3 settled rows a
    # sequence (4 of 8 sequences with 3), the second one row each, 2.44 tokens further on
    one_step = SchedulerConfig(max_num_batched_tokens=batch * 1024, long_prefill_token_threshold=0)
    w = Workload(
        batch, 1024, 64, speculative_tokens=2, acceptance=0.8, speculative_method="mtp", context=ctx, scheduler=one_step
    )
    pred = predict(v3, get_hardware_spec("h200-sxm"), w)
    first = draft_forward(p, [Chunk(3, ctx, True)] * 4 + [Chunk(2, ctx, True)] * 4)[0]
    second = draft_forward(p, [Chunk(1, ctx + 2.44, True)] * batch)[0]  # type: ignore[arg-type]
    assert pred.draft_s == pytest.approx(first + second)
    assert pred.tpot_s == pytest.approx((pred.decode_step_s + pred.draft_s) / 2.44)
    # the prompts' catch-up forward (all in one step here) runs before the first token is handed back
    plain = predict(v3, get_hardware_spec("h200-sxm"), replace(w, speculative_tokens=0))
    catch_up = draft_forward(p, [Chunk(1024, 0, True)] * batch)[0]
    catch_up += draft_forward(p, [Chunk(1, 1024, True)] * batch)[0]
    assert pred.ttft_s == pytest.approx(plain.ttft_s + catch_up)


def test_under_data_parallel_attention_a_mixed_step_prices_the_busiest_rank_s_sequences():
    """Each rank attends over (and projects) its own sequences only: the batch prefilled in one
    simulated step costs what the uniform step of ceil(batch / tp) sequences' attention does."""
    from tacit.perf_model.operators import Parallel

    v3 = shape_from_hf(load_hf_config("DeepSeek-V3"))
    one_step = SchedulerConfig(max_num_batched_tokens=13 * 512, long_prefill_token_threshold=0)
    w = Workload(13, 512, 16, "fp8", parallel=Parallel(8, True, True), scheduler=one_step)
    pred = predict(v3, get_hardware_spec("h200-sxm"), w)
    assert pred.ttft.prefill_steps == 1
    assert pred.ttft.mean_s == pytest.approx(pred.prefill_step_s, rel=0.01)


def test_an_accelerator_s_ttft_takes_the_serving_engines_chunking_not_tacit_s_cpu_defaults(tmp_path):
    """On a part tacit does not run on, the flags not given take vLLM's / SGLang's GPU defaults
    (8192 tokens a step, no cap on one prompt): an 11000-token prompt is two steps, not 22 of
    tacit's 512-token long-prompt cap; given flags still win."""
    argv = ["predict", "--model", "Llama-3.1-8B", "--hardware", "h100-sxm", "--input-len", "11000"]
    out = tmp_path / "p.json"
    _run([*argv, "--output-len", "4", "--json", str(out)])
    ttft = json.loads(out.read_text())["ttft"]
    assert (ttft["max_num_batched_tokens"], ttft["long_prefill_token_threshold"], ttft["prefill_steps"]) == (8192, 0, 2)
    _run([*argv, "--output-len", "4", "--max-num-batched-tokens", "2048", "--json", str(out)])
    assert json.loads(out.read_text())["ttft"]["prefill_steps"] == 6  # ceil(11000 / 2048)


def test_data_parallel_attention_ranks_each_schedule_their_own_prompts():
    """32 attention ranks of 4 prompts of 4096 tokens each, 8192 tokens a rank a step: two steps
    (each rank's own budget), not the 64 that one 8192-token budget over all 128 prompts takes."""
    from tacit.perf_model.operators import Parallel

    v3 = shape_from_hf(load_hf_config("DeepSeek-V3"))
    per_rank = SchedulerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=0, max_num_seqs=128)
    layout = Parallel(1, True, dp=32)
    pred = predict(v3, H100, Workload(128, 4096, 1, "fp8", parallel=layout, scheduler=per_rank))  # no decodes
    assert pred.ttft.prefill_steps == 2


def test_a_serving_engine_s_verify_step_reads_each_sequence_s_kv_once():
    """On an accelerator the verify step's k + 1 rows of a sequence share one read of its KV
    (q_len k + 1 attention), where tacit's own fused decoder on this CPU attends each row alone."""
    llama = shape_from_hf(load_hf_config("Llama-3.1-8B"))

    def attention_bytes(pred) -> float:
        return sum(t.op.bytes for t in pred.decode_ops if t.op.op_class == "attention")

    plain = predict(llama, H100, Workload(8, 4096, 16))
    verify = predict(llama, H100, Workload(8, 4096, 16, speculative_tokens=3, acceptance=0.6))
    kv = 8 * (4096 + 7) * 32 * 2 * 8 * 128 * 2  # sequences x context x layers x (K, V) x KV heads x dim x bf16
    assert attention_bytes(plain) == pytest.approx(kv, rel=0.01)
    assert attention_bytes(verify) == pytest.approx(kv, rel=0.01)


def test_an_mtp_draft_s_eh_proj_runs_on_a_device_s_own_sequences_under_dp_attention():
    """At the same sequences a device, the MTP draft's eh_proj does not grow with the number of
    data-parallel attention ranks: each projects its own group's rows."""
    from tacit.perf_model.operators import Parallel

    v3 = shape_from_hf(load_hf_config("DeepSeek-V3"))

    def eh_ms(ranks: int) -> float:
        w = Workload(ranks * 8, 0, 8, "fp8", parallel=Parallel(ranks, True, True), context=2048)
        w = replace(w, speculative_tokens=1, acceptance=0.8, speculative_method="mtp")
        pred = predict(v3, H100, w)
        return sum(t.seconds for t in pred.draft_ops if t.op.name == "mtp_eh_proj")

    assert eh_ms(16) == pytest.approx(eh_ms(8))
