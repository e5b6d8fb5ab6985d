"""`tacit predict --serve`: the real scheduler on a simulated clock, checked by hand and by shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tacit.bench.workload_file import WorkloadRequest, load_workload, make_workload, write_workload
from tacit.config import SchedulerConfig
from tacit.perf_model.efficiency import load_profile
from tacit.perf_model.model_shape import shape_from_hf
from tacit.perf_model.operators import Parallel, StepShape
from tacit.perf_model.predict import Workload, step_time
from tacit.perf_model.serve_sim import KVPool, roofline_pricer, simulate, summarize
from tacit.perf_model.step_model import Chunk, MixedStep, Pricing, mixed_step_seconds
from tacit.platforms.hardware_table import get_hardware_spec
from tests.perf_model.test_counts import DENSE, MLA, MOE

ROOT = Path(__file__).resolve().parents[2]
BIG = KVPool(10_000, 16)


def _const(dt: float):
    return lambda step: dt


def test_two_requests_constant_step_exact():
    # Both arrive at 0 and prefill together in step 1 (0 -> 0.1 s): first tokens at 0.1 s.
    # Steps 2 and 3 decode tokens 2 and 3: last token at 0.3 s, TPOT (0.3 - 0.1) / 2 = 0.1 s.
    wl = [WorkloadRequest(0.0, 4, 3), WorkloadRequest(0.0, 6, 3)]
    sim = simulate(wl, _const(0.1), BIG)
    for r in sim.results:
        assert r.ttft == pytest.approx(0.1) and r.e2e == pytest.approx(0.3) and r.tpot == pytest.approx(0.1)
    assert sim.num_steps == 3 and sim.duration_s == pytest.approx(0.3)


def test_arrival_mid_step_waits_for_the_next_step():
    # B arrives at 0.05 s, during A's prefill step; it prefills in step 2 (0.1 -> 0.2): TTFT 0.15 s.
    # Its 2 decodes end at 0.4 s: E2E 0.35 s. A: tokens at 0.1, 0.2, 0.3.
    wl = [WorkloadRequest(0.0, 4, 3), WorkloadRequest(0.05, 4, 3)]
    a, b = simulate(wl, _const(0.1), BIG).results
    assert (a.ttft, a.e2e) == (pytest.approx(0.1), pytest.approx(0.3))
    assert (b.ttft, b.e2e) == (pytest.approx(0.15), pytest.approx(0.35))


def test_idle_gap_jumps_the_clock():
    wl = [WorkloadRequest(0.0, 4, 2), WorkloadRequest(5.0, 4, 2)]
    sim = simulate(wl, _const(0.1), BIG)
    assert sim.results[1].ttft == pytest.approx(0.1)
    assert sim.duration_s == pytest.approx(5.2) and sim.busy_s == pytest.approx(0.4)


def test_chunked_prefill_splits_a_long_prompt():
    # A 10-token prompt under a 4-token budget prefills over 3 steps: first token after step 3.
    cfg = SchedulerConfig(max_num_batched_tokens=4, long_prefill_token_threshold=0)
    (r,) = simulate([WorkloadRequest(0.0, 10, 2)], _const(0.1), BIG, cfg).results
    assert r.ttft == pytest.approx(0.3) and r.e2e == pytest.approx(0.4)


def test_kv_block_limit_queues_the_second_request():
    # 3 blocks of 4 tokens: A (8 prompt + 4 output = 12 tokens) needs all 3, so B waits until A
    # finishes and frees them, as the real scheduler's allocate_slots refuses it.
    wl = [WorkloadRequest(0.0, 8, 4), WorkloadRequest(0.0, 8, 4)]
    a, b = simulate(wl, _const(0.1), KVPool(3, 4)).results
    assert a.e2e == pytest.approx(0.4)
    assert b.ttft > a.e2e


def test_kv_block_limit_preempts_when_decodes_grow():
    # Both prompts (4 tokens = 1 block each) fit; their decodes then need more blocks than the
    # 3 in the pool, so the scheduler preempts the newest (FCFS) and recomputes it later.
    wl = [WorkloadRequest(0.0, 4, 6), WorkloadRequest(0.0, 4, 6)]
    sim = simulate(wl, _const(0.1), KVPool(3, 4))
    assert sim.num_preemptions >= 1
    assert all(r.ok and r.output_tokens == 6 for r in sim.results)
    assert sim.results[1].e2e > sim.results[0].e2e


def test_request_larger_than_the_pool_is_refused_naming_it():
    with pytest.raises(ValueError, match="workload request 2"):
        simulate([WorkloadRequest(0.0, 4, 4), WorkloadRequest(0.0, 40, 4)], _const(0.1), KVPool(3, 4))


def _pricing(cfg: dict, tp: int = 1, ep: bool = False) -> Pricing:
    spec = get_hardware_spec("h200-sxm")
    return Pricing(shape_from_hf(cfg), spec, load_profile(spec.efficiency_profile), parallel=Parallel(tp, ep))


@pytest.mark.parametrize("cfg", [DENSE, MOE, MLA], ids=["dense", "moe", "mla"])
def test_uniform_mixed_step_equals_predicts_step(cfg):
    p = _pricing(cfg)
    w = Workload(8, 256, 32)
    dec = step_time(p.shape, p.spec, p.profile, w, StepShape(8, 1, 300))[0]
    pre = step_time(p.shape, p.spec, p.profile, w, StepShape(1, 256, 0))[0]
    assert mixed_step_seconds(p, MixedStep([Chunk(1, 300, True)] * 8)) == pytest.approx(dec)
    assert mixed_step_seconds(p, MixedStep([Chunk(256, 0, True)])) == pytest.approx(pre)


def test_mixed_step_costs_more_than_its_decodes_and_less_than_separate_steps():
    p = _pricing(DENSE)
    decodes = [Chunk(1, 500, True)] * 16
    prefill = [Chunk(256, 0, True)]
    both = mixed_step_seconds(p, MixedStep(decodes + prefill))
    assert mixed_step_seconds(p, MixedStep(decodes)) < both
    # one weight read for both: cheaper than two steps
    assert both < mixed_step_seconds(p, MixedStep(decodes)) + mixed_step_seconds(p, MixedStep(prefill))


def test_more_load_never_lowers_p90_ttft():
    p = _pricing(DENSE)
    base = make_workload(60, 1.0, "uniform", 256, 32, seed=3)
    p90 = []
    for speedup in (1, 4, 16, 64):  # the same requests arriving speedup x faster
        wl = [WorkloadRequest(w.arrival_s / speedup, w.input_len, w.output_len) for w in base]
        out = summarize(simulate(wl, roofline_pricer(p), KVPool(2000, 16)), {})
        p90.append(out["ttft_ms"]["p90"])
    # lightly loaded, p90 is one prefill at any speed: equal up to float rounding of arrival / speedup
    assert all(b >= a * (1 - 1e-9) for a, b in zip(p90, p90[1:])), p90


def test_goodput_counts_requests_meeting_the_slo():
    wl = [WorkloadRequest(0.0, 4, 3), WorkloadRequest(0.25, 4, 3)]  # B: TTFT ~0.15 s
    sim = simulate(wl, _const(0.1), BIG)
    out = summarize(sim, {"ttft": 0.12})
    assert out["completed"] == 2 and out["goodput_req_s"] == pytest.approx(1 / sim.duration_s)
    assert out["ttft_ms"]["p50"] == pytest.approx(125.0)


@pytest.mark.parametrize(
    "line, message",
    [
        ("not json", "line 2: not JSON"),
        ('{"arrival_s": 0, "input_len": 4}', "line 2: missing 'output_len'"),
        ('{"arrival_s": -1, "input_len": 4, "output_len": 2}', "line 2: arrival_s"),
        ('{"arrival_s": 0, "input_len": 0, "output_len": 2}', "line 2: input_len"),
        ('{"arrival_s": 0, "input_len": 4, "output_len": 2.5}', "line 2: output_len"),
        ('{"arrival_s": 0, "input_len": 4, "output_len": 2, "prio": 1}', "line 2: unknown field"),
        ("[1, 2]", "line 2: must be a JSON object"),
    ],
)
def test_bad_workload_line_is_refused_naming_it(tmp_path, line, message):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0, "input_len": 4, "output_len": 2}\n' + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_workload(f)


def test_workload_roundtrip_and_comments(tmp_path):
    reqs = make_workload(5, 2.0, "fixed", 16, 4)
    f = tmp_path / "w.jsonl"
    write_workload(reqs, f)
    f.write_text("# a comment\n\n" + f.read_text())
    assert load_workload(f) == reqs
    assert reqs[0].arrival_s == 0 and all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))


def test_cli_serve_json(tmp_path):
    wl, out = tmp_path / "w.jsonl", tmp_path / "o.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    gen = [sys.executable, "-m", "tacit.cli", "bench", "workload", "--out", str(wl), "--num-prompts", "8"]
    gen += ["--request-rate", "4", "--dist", "fixed", "--input-len", "128", "--output-len", "8"]
    assert subprocess.run(gen, cwd=ROOT, capture_output=True, text=True, env=env).returncode == 0
    assert load_workload(wl) == make_workload(8, 4.0, "fixed", 128, 8)
    cmd = [sys.executable, "-m", "tacit.cli", "predict", "--serve", "--model", "Llama-3.1-8B", "--hardware"]
    cmd += ["h200-sxm", "--workload", str(wl), "--slo", "ttft:500", "--json", str(out)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    d = json.loads(out.read_text())
    assert d["completed"] == 8 and set(d["ttft_ms"]) == {"mean", "p50", "p90", "p99"}
    assert "TTFT" in res.stdout and "goodput" in res.stdout


def test_priority_policy_from_the_workload_serves_the_urgent_request_first():
    # max_num_seqs 1: one request at a time. The priority-1 request arrives first in the file but
    # at the same time; under priority the priority-0 one runs first, under fcfs it waits.
    wl = [WorkloadRequest(0.0, 4, 3, priority=1), WorkloadRequest(0.0, 4, 3, priority=0)]
    fcfs = simulate(wl, _const(0.1), BIG, SchedulerConfig(max_num_seqs=1))
    prio = simulate(wl, _const(0.1), BIG, SchedulerConfig(max_num_seqs=1, policy="priority"))
    # results are in arrival order (file order on ties): the urgent one is the second
    assert fcfs.results[1].ttft == pytest.approx(0.4) and prio.results[1].ttft == pytest.approx(0.1)


def test_urgent_arrival_cuts_in_at_the_next_layer_boundary():
    # A (priority 1) prefills 0 -> 0.1 s over 4 layers; B (priority 0, more urgent) arrives at
    # 0.04 s. The boundary at 0.05 s takes B in and prefills it there (0.05 -> 0.15: TTFT 0.11 s);
    # A's step resumes and ends at 0.2 s. Then both decode: 0.2 -> 0.3 -> 0.4.
    wl = [WorkloadRequest(0.0, 4, 3, priority=1), WorkloadRequest(0.04, 4, 3, priority=0)]
    cfg = SchedulerConfig(policy="priority")
    sim = simulate(wl, _const(0.1), BIG, cfg, num_layers=4)
    a, b = sim.results
    assert (b.ttft, b.e2e) == (pytest.approx(0.11), pytest.approx(0.36))
    assert (a.ttft, a.e2e) == (pytest.approx(0.2), pytest.approx(0.4))
    assert sim.num_cut_ins == 1 and sim.num_steps == 4 and summarize(sim, {})["num_cut_ins"] == 1
    # Without cut-in (0 tokens, fcfs, or no layer boundary) B waits for A's step: TTFT 0.16 s.
    for waits in (
        simulate(wl, _const(0.1), BIG, SchedulerConfig(policy="priority", cut_in_prefill_tokens=0), num_layers=4),
        simulate(wl, _const(0.1), BIG, SchedulerConfig(), num_layers=4),
        simulate(wl, _const(0.1), BIG, cfg, num_layers=1),
    ):
        assert waits.results[1].ttft == pytest.approx(0.16) and waits.num_cut_ins == 0


def test_cut_in_only_for_prompts_within_its_budget():
    # B's 300-token prompt is over cut_in_prefill_tokens (256): it waits for A's step to end.
    wl = [WorkloadRequest(0.0, 4, 3, priority=1), WorkloadRequest(0.04, 300, 3, priority=0)]
    sim = simulate(wl, _const(0.1), BIG, SchedulerConfig(policy="priority"), num_layers=4)
    assert sim.num_cut_ins == 0 and sim.results[1].ttft == pytest.approx(0.16)


def _serve_argv(tmp_path, *flags, n=8, rate=1000.0, input_len=128, output_len=8) -> list[str]:
    wl = tmp_path / "w.jsonl"
    write_workload(make_workload(n, rate, "fixed", input_len, output_len), wl)
    argv = ["predict", "--serve", "--model", "Llama-3.1-8B", "--hardware", "h200-sxm", "--workload", str(wl)]
    return [*argv, "--json", str(tmp_path / "o.json"), *flags]


def _serve(tmp_path, *flags, **workload):
    from tacit.cli import main

    assert main(_serve_argv(tmp_path, *flags, **workload)) == 0
    return json.loads((tmp_path / "o.json").read_text())


def test_cli_serve_slo_class_rejects_under_sla(tmp_path):
    """--slo-class reaches the real scheduler: a 1 ms TTFT target for class 0 is one the sla
    policy's admission control cannot meet once its cost model has seen a few steps (requests
    every 10 ms, steps of a few ms)."""
    plain = _serve(tmp_path, "--scheduling-policy", "sla", n=40, rate=100.0)
    strict = _serve(tmp_path, "--scheduling-policy", "sla", "--slo-class", "0:ttft=1", n=40, rate=100.0)
    assert plain["completed"] == 40 and plain["failed"] == 0
    assert strict["failed"] > 0 and strict["completed"] + strict["failed"] == 40


def test_cli_serve_without_chunked_prefill_prefills_a_long_prompt_whole(tmp_path):
    chunked = _serve(tmp_path, n=1, input_len=5000, output_len=2)
    whole = _serve(tmp_path, "--no-chunked-prefill", n=1, input_len=5000, output_len=2)
    assert chunked["completed"] == whole["completed"] == 1
    # 5000 prompt tokens: 10 steps of 512 (the long-prefill cap) then a decode, or one step then a decode
    assert chunked["num_steps"] == 11 and whole["num_steps"] == 2


def test_cli_serve_without_chunked_prefill_budgets_the_models_length_as_the_engine_does(tmp_path):
    """The engine raises the budget to the model's max_model_len (Llama-3.1-8B: 131,072), not to
    the longest request: eight 400-token prompts (none long: under the 512 threshold) arriving
    together prefill in one step, then seven decode steps of eight rows (with the default
    budget of 2,048, which the longest request did not raise, five went first: nine steps)."""
    whole = _serve(tmp_path, "--no-chunked-prefill", n=8, rate=1e9, input_len=400, output_len=8)
    assert whole["completed"] == 8 and whole["num_steps"] == 8
    assert whole["ttft_ms"]["p50"] == whole["ttft_ms"]["p99"]


def test_cli_serve_replays_cut_in_with_the_engine_flag(tmp_path):
    """Four priority-1 prompts of 4096 tokens prefill in 512-token chunks; a priority-0 prompt of
    64 arriving 1 ms in cuts into the step in flight by default (256 tokens), and waits for it
    with --cut-in-prefill-tokens 0 (its TTFT: test_urgent_arrival_cuts_in_at_the_next_layer_boundary)."""
    wl = [WorkloadRequest(0.0, 4096, 16, priority=1) for _ in range(4)] + [WorkloadRequest(0.001, 64, 16, priority=0)]
    write_workload(wl, tmp_path / "urgent.jsonl")

    def serve(*flags):
        from tacit.cli import main

        argv = ["predict", "--serve", "--model", "Llama-3.1-8B", "--hardware", "h200-sxm", "--workload"]
        argv += [str(tmp_path / "urgent.jsonl"), "--scheduling-policy", "priority", "--json", str(tmp_path / "o.json")]
        assert main([*argv, *flags]) == 0
        return json.loads((tmp_path / "o.json").read_text())

    cut, wait = serve(), serve("--cut-in-prefill-tokens", "0")
    assert cut["num_cut_ins"] == 1 and wait["num_cut_ins"] == 0
    assert cut["completed"] == wait["completed"] == 5
    assert cut["num_steps"] == wait["num_steps"] + 1  # the cut-in's own forward


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--preemption-mode", "swap"], "--preemption-mode swap needs --swap-space GiB"),
        (["--swap-space", "1"], "--swap-space needs --swap-bandwidth GB/s"),
        (["--scheduling-policy", "lifo"], "scheduling_policy='lifo' is not known"),
        # one prediction's flags: the workload file gives the lengths; no spec decode, no prefix cache
        (["--input-len", "999"], "--input-len does not go with --serve: the workload file gives"),
        (["--batch-size", "8"], "--batch-size does not go with --serve"),
        (["--speculative-tokens", "3"], "--speculative-tokens does not go with --serve"),
        (["--speculative-method", "mtp"], "--speculative-method does not go with --serve"),
        (["--prefix-hit-rate", "0.5"], "--prefix-hit-rate does not go with --serve: the replay does not model"),
        (["--ops"], "--ops does not go with --serve"),
    ],
)
def test_cli_serve_refuses_what_it_cannot_replay_naming_it(tmp_path, capsys, flags, message):
    from tacit.cli import main

    assert main(_serve_argv(tmp_path, *flags)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_cli_serve_swaps_when_given_a_swap_space_and_prices_the_copies(tmp_path):
    """A KV pool of 64 blocks for 16 requests of 512 + 256 tokens: preemptions. With a swap
    space they swap (the scheduler's own SwapSpace decides), and a slower host link makes the
    same run longer by exactly the copies' time."""
    common = ["--kv-blocks", "64", "--max-num-seqs", "16", "--preemption-mode"]
    work = {"n": 16, "input_len": 512, "output_len": 256}
    recompute = _serve(tmp_path, *common, "recompute", **work)
    fast = _serve(tmp_path, *common, "swap", "--swap-space", "64", "--swap-bandwidth", "50", **work)
    slow = _serve(tmp_path, *common, "swap", "--swap-space", "64", "--swap-bandwidth", "0.5", **work)
    assert recompute["num_preemptions"] > 0 and recompute["num_swapped_out"] == 0
    for run in (fast, slow):
        assert run["completed"] == 16 and run["num_swapped_out"] == run["num_preemptions"] > 0
    # same decisions (swap mode always swaps), so the same steps: the copies are the difference
    assert fast["num_steps"] == slow["num_steps"] and fast["num_swapped_out"] == slow["num_swapped_out"]
    assert slow["swap_s"] == pytest.approx(100 * fast["swap_s"])
    assert slow["duration_s"] - fast["duration_s"] == pytest.approx(slow["swap_s"] - fast["swap_s"], rel=1e-6)


def test_padded_decode_groups_are_the_torch_backends_own():
    """The step model's decode groups are kernels/torch_attention.group_requests' for the same
    contexts: each group's rows, attending its longest member's blocks whole."""
    import numpy as np

    from tacit.kernels.torch_attention import group_requests
    from tacit.perf_model.step_model import padded_decode_contexts

    rng = np.random.default_rng(0)
    for bs in (8, 16, 64):
        contexts = rng.integers(0, 3000, 57)
        sets = group_requests(np.ones(57, dtype=np.int64), contexts, bs)
        engine = sorted((len(s), int(-(-(contexts[s] + 1).max() // bs)) * bs - 1) for s in sets)
        assert sorted(padded_decode_contexts(contexts.tolist(), bs)) == engine


def test_torch_path_decodes_are_priced_padded_to_their_group_and_a_fused_path_at_their_own():
    from dataclasses import replace

    from tacit.perf_model.step_model import padded_decode_contexts

    fused = _pricing(DENSE)
    torch_path = replace(fused, profile=replace(fused.profile, torch_decode_architectures=("*",)))
    mixed = MixedStep([Chunk(1, c, True) for c in (20, 40, 100, 1000, 1100, 1500)])
    padded = replace(torch_path, padded_decode_block=16)
    # the fused decoder reads each sequence's own context: padding does not apply to it
    assert mixed_step_seconds(replace(fused, padded_decode_block=16), mixed) == mixed_step_seconds(fused, mixed)
    # torch_paged: each row attends its group's longest context (1100 and 1500 share a bucket)
    assert mixed_step_seconds(padded, mixed) > mixed_step_seconds(torch_path, mixed)
    groups = padded_decode_contexts([20, 40, 100, 1000, 1100, 1500], 16)
    assert groups == [(1, 31), (1, 47), (1, 111), (1, 1007), (2, 1503)]
    as_groups = sum(
        mixed_step_seconds(replace(torch_path, padded_decode_block=None), MixedStep([Chunk(1, ctx, True)] * rows))
        for rows, ctx in groups
    )
    assert mixed_step_seconds(padded, mixed) < as_groups  # one step: the weights read once, not per group


def test_each_padded_decode_group_past_the_first_costs_its_fitted_host_time_a_layer():
    from dataclasses import replace

    base = _pricing(DENSE)
    torch_path = replace(base, profile=replace(base.profile, torch_decode_architectures=("*",)), padded_decode_block=16)
    costed = replace(torch_path, profile=replace(torch_path.profile, attention_decode_torch_group_s=1e-4))
    layers = torch_path.shape.num_layers
    five_groups = MixedStep([Chunk(1, c, True) for c in (20, 40, 100, 1000, 1100, 1500)])
    one_group = MixedStep([Chunk(1, c, True) for c in (1100, 1200, 1500)])  # one power-of-two bucket
    for step, groups in ((five_groups, 5), (one_group, 1)):
        extra = mixed_step_seconds(costed, step) - mixed_step_seconds(torch_path, step)
        assert extra == pytest.approx((groups - 1) * layers * 1e-4)


def test_the_group_cost_is_fitted_on_steps_the_backend_runs_in_one_and_two_groups():
    from tacit.perf_model.fit_attention import ONE_GROUP, TWO_GROUPS, torch_decode_group_seconds

    assert ONE_GROUP != TWO_GROUPS
    seconds = torch_decode_group_seconds(1, "fp32")  # raises unless the contexts split 1 and 2
    assert 0.0 <= seconds < 0.1


def test_torch_paged_prefill_group_is_the_backends_own():
    """The step model's prefill group is kernels/torch_attention.build_group's for the same
    chunks: its query rows, gathered keys and scored query-key pairs, padded or flat."""
    import numpy as np
    import torch

    from tacit.kernels.torch_attention import build_group
    from tacit.perf_model.step_model import torch_paged_prefill_scores

    rng = np.random.default_rng(0)
    forms = set()
    for bs in (16, 64):
        for _ in range(40):
            r = int(rng.integers(1, 9))
            n = rng.integers(2, 600, r) if rng.random() < 0.5 else np.full(r, int(rng.integers(2, 300)))
            c = rng.integers(0, 1500, r) * (rng.random() < 0.7)
            tables = np.arange(r * 160, dtype=np.int64).reshape(r, 160)  # 2,100 tokens in 16s
            g = build_group(np.arange(r), n, c, tables, None, torch.device("cpu"), bs)
            forms.add(g.flat_keys is not None)
            got = torch_paged_prefill_scores(list(zip(n.tolist(), c.tolist())), bs)
            assert got == (g.max_query_len, g.block_tables.numel() * bs, g.attn_mask.numel())
    assert forms == {True, False}  # both forms checked


def _fitted_pricing(block: int | None) -> Pricing:
    """The shipped fit of tacit's own engine on a 2-vCPU VM (its prefill curve torch_paged's)."""
    spec = get_hardware_spec("h200-sxm")
    return Pricing(shape_from_hf(DENSE), spec, load_profile("vm-2vcpu-no-amx-1thread"), padded_decode_block=block)


def test_torch_paged_prefill_group_priced_as_the_backend_scores_it():
    from dataclasses import replace

    from tacit.perf_model.step_model import mixed_step_times

    def attention(p: Pricing, step: MixedStep) -> float:
        return sum(t.seconds for t in mixed_step_times(p, step)[1] if t.op.name == "attention")

    paged, per_chunk = _fitted_pricing(16), _fitted_pricing(None)
    # a whole prompt from 0 in 16-token blocks is the fit's own shape: the same price either way
    whole = MixedStep([Chunk(512, 0, True)])
    assert mixed_step_seconds(paged, whole) == pytest.approx(mixed_step_seconds(per_chunk, whole))
    # a chunk on a cached context scores its whole rectangle, where the fit's frame charges the
    # causal half of a fresh prompt's: less than the causal count of 512 on 512 says
    later = MixedStep([Chunk(512, 512, True)])
    assert attention(paged, later) < attention(per_chunk, later)
    # chunks of very different lengths in one group score every key of the group: 5.4x the
    # causal count here (the bursty replay's step of 1,347 tokens)
    burst = MixedStep([Chunk(419, 512, True)] + [Chunk(t, 0, True) for t in (32, 45, 207, 34, 34, 64, 512)])
    assert attention(paged, burst) > 2 * attention(per_chunk, burst)
    # a profile not fitted on the engine (no roofs) prices per chunk, as a varlen kernel runs them
    unfitted = replace(paged, profile=replace(paged.profile, roofs=None))
    assert mixed_step_seconds(unfitted, burst) == mixed_step_seconds(replace(unfitted, padded_decode_block=None), burst)


def test_merged_mla_prefill_chunks_keep_their_gemm_and_kernel():
    """Several prompts in one step merge into one op per name: kv_b_proj stays a GEMM over every
    chunk's keys (the engine's one F.linear over the group's latents) and the attention keeps
    MLA's prefill curve. Merged from the seven plain fields, a 16 x 32 prefill of deepseek-v3-1b
    priced kv_b_proj at the elementwise efficiency, 3.6x o_proj's time for the same FLOPs."""
    from tacit.perf_model.attention_ops import attention_ops
    from tacit.perf_model.roofline import op_time
    from tacit.perf_model.step_model import mixed_step_times

    p = _fitted_pricing(16)
    p = Pricing(shape_from_hf(MLA), p.spec, p.profile, padded_decode_block=16)
    chunks = 4
    ops = {t.op.name: t for t in mixed_step_times(p, MixedStep([Chunk(32, 0, True)] * chunks))[1]}
    one = {
        op.name: op
        for op in attention_ops(p.shape, StepShape(1, 32, 0), p.parallel, p.weight_dtype, p.kv_dtype, p.group_size)
    }
    kv_b = ops["kv_b_proj"]
    assert kv_b.op.is_gemm and kv_b.op.rows == chunks * 32 and kv_b.op.launches == one["kv_b_proj"].launches
    # priced as one GEMM of the summed rows on the dtype's curve, as the step's o_proj is
    whole = op_time(
        replace(one["kv_b_proj"], flops=chunks * one["kv_b_proj"].flops, bytes=kv_b.op.bytes, rows=chunks * 32),
        p.spec,
        p.profile,
        False,
    )
    assert kv_b.seconds == pytest.approx(whole.seconds)
    assert ops["attention"].op.kernel == "mla" and ops["attention"].op.layers == p.shape.num_layers


def test_cli_serve_prices_the_activation_dtype_it_is_given(tmp_path):
    """--activation-dtype reaches the replay's steps: W8A8 int8 prompts at the int8 peak, the
    same weights with bf16 activations (W8A16) at the bf16 one, so the replay's TTFTs differ."""
    from tacit.cli import main

    wl = tmp_path / "w.jsonl"
    write_workload(make_workload(4, 1.0, "fixed", 2048, 4), wl)
    base = ["predict", "--serve", "--model", "Llama-3.1-8B", "--hardware", "h100-sxm", "--workload", str(wl)]
    base += ["--quantization", "w8a8_int8"]
    ttft = {}
    for act in ("auto", "int8", "bf16"):
        out = tmp_path / f"{act}.json"
        assert main([*base, "--activation-dtype", act, "--json", str(out)]) == 0
        ttft[act] = json.loads(out.read_text())["ttft_ms"]["mean"]
    assert ttft["auto"] == ttft["int8"] and ttft["bf16"] > 1.2 * ttft["int8"]
