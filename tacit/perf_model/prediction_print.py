"""`tacit predict`'s printed report of one prediction: the heading, TTFT / TPOT / throughput /
memory, the bottlenecks and (--ops) every operator of its steps."""

from __future__ import annotations

import argparse

from tacit.perf_model.dtypes import activation_dtype
from tacit.perf_model.layout_cli import describe_layout
from tacit.perf_model.predict import Prediction, Workload
from tacit.perf_model.roofline import OpTime
from tacit.platforms.specs import HardwareSpec


def heading_of(args: argparse.Namespace, spec: HardwareSpec, work: Workload, pred: Prediction) -> str:
    act = activation_dtype(work.weight_dtype, work.activation_dtype, fp8_units="fp8" in spec.flops)
    spec_part = (
        f", {work.speculative_method} drafts {work.speculative_tokens} a step at acceptance {work.acceptance} "
        f"({work.tokens_per_verify:.2f} tokens a verify)"
        if work.speculative_tokens
        else ""
    )
    prompt = (
        f"input {work.input_len}{f' ({work.cached_tokens} cached)' if work.cached_tokens else ''}"
        if work.input_len
        else f"no prefill (input 0, {work.context} cached)"
    )
    batch = f"{work.request_rate:g} requests/s (Poisson)" if work.request_rate is not None else f"batch {work.batch}"
    return (
        f"{args.model} on {spec.name} ({spec.description}), {describe_layout(pred.layout)}, "
        f"weights {work.weight_dtype}, activations {act}, KV {work.kv_dtype}, {batch}, {prompt}, output {work.output_len}"
        + (f", decode at context {work.context}" if work.context is not None else "")
        + spec_part
        + (f", priced with the {spec.efficiency_profile} profile" if args.efficiency_profile else "")
    )


def _ttft_lines(pred: Prediction) -> list[str]:
    t, o = pred.ttft, pred.open_loop
    if o is not None:
        return [
            f"  TTFT        {1e3 * o.served_ttft_s:.2f} ms mean at {o.request_rate:g} requests/s a replica: "
            f"{1e3 * o.wait_s:.2f} waiting (the step in flight, prompts queued before it), then "
            f"{1e3 * o.prefill_one_s:.2f} its prompt alone",
            f"  in flight   {o.in_flight:.2f} requests on average, {o.decoding:.2f} decoding (Little's law): the "
            f"decode step priced at {o.decode_batch} sequences a replica",
        ]
    if t is None:
        return ["  TTFT        none: no prefill (--input-len 0)"]
    lines = [f"  TTFT        {1e3 * t.mean_s:.2f} ms mean of the batch"]
    if t.prefill_steps > 1 or t.max_s > t.mean_s:
        lines[0] += (
            f" (p50 {1e3 * t.p50_s:.2f}, p99 {1e3 * t.p99_s:.2f}, max {1e3 * t.max_s:.2f}): its prompts over "
            f"{t.prefill_steps} steps of at most {t.max_num_batched_tokens} tokens (--max-num-batched-tokens)"
        )
        if t.long_prefill_token_threshold:
            lines[0] += f", {t.long_prefill_token_threshold} a prompt (--long-prefill-token-threshold; 0: no cap)"
    lines.append(f"  prefill     {1e3 * pred.prefill_step_s:.2f} ms for the whole batch's prompts in one step")
    return lines


def print_prediction(args: argparse.Namespace, spec: HardwareSpec, work: Workload, pred: Prediction) -> str:
    """Print the heading and the headline figures; the heading is returned (the HTML's title)."""
    heading = heading_of(args, spec, work, pred)
    print(heading)
    for line in _ttft_lines(pred):
        print(line)
    where = f"at context {pred.decode_context}" if pred.at_context else f"at the mean context {pred.decode_context}"
    print(f"  TPOT        {1e3 * pred.tpot_s:.3f} ms {where}")
    if work.speculative_tokens:
        draft = f" + {1e3 * pred.draft_s:.3f} ms of MTP drafts" if pred.draft_s else ""
        print(
            f"  decode step {1e3 * pred.decode_step_s:.3f} ms verify of {work.speculative_tokens + 1} rows a sequence"
            f"{draft}, {work.tokens_per_verify:.2f} tokens a sequence"
        )
    else:
        print(f"  decode step {1e3 * pred.decode_step_s:.3f} ms")
    if pred.open_loop is not None and work.output_len > 1:
        print(
            f"  served TPOT {1e3 * pred.served_tpot_s:.3f} ms with requests arriving at --request-rate "
            f"{work.request_rate:g} (Poisson), prompts prefilled on the same devices: they take "
            f"{100 * pred.served_prefill_share:.1f}% of the time; {pred.served_throughput_tok_s:.1f} output tok/s"
        )
    elif pred.ttft is not None and work.batch > 1 and work.output_len > 1:
        print(
            f"  served TPOT {1e3 * pred.served_tpot_s:.3f} ms with the batch served as a closed loop, prompts "
            f"prefilled on the same devices (bench_serving --max-concurrency {work.batch}): the others' "
            f"prefills take {100 * pred.served_prefill_share:.0f}% of the time; "
            f"{pred.served_throughput_tok_s:.1f} output tok/s"
        )
    scope = (
        "the decode step's at that context"
        if pred.at_context
        else "every request's, at the rate"
        if pred.open_loop
        else "the batch's, prefill included"
    )
    print(f"  throughput  {pred.throughput_tok_s:.1f} output tok/s ({scope})")
    mem = pred.memory
    print(
        f"  memory      {mem.total / 1e9:.2f} GB per device (weights {mem.weights / 1e9:.2f}, "
        f"KV {mem.kv_cache / 1e9:.2f}, activations {mem.activations / 1e9:.2f}) of "
        f"{pred.capacity_bytes / 1e9:.1f}: {'fits' if pred.fits else 'does NOT fit'}"
    )
    return heading


def print_bottlenecks(pred: Prediction) -> None:
    print("  bottlenecks:")
    for k, v in pred.bottlenecks.items():
        print(f"    {k}: {v}")


def print_ops(pred: Prediction, speculative: bool) -> None:
    if pred.prefill_ops:
        print_step_ops("prefill", pred.prefill_ops, pred.prefill_step_s)
    print_step_ops("verify" if speculative else "decode", pred.decode_ops, pred.decode_step_s)
    if pred.draft_ops:
        print(f"  MTP drafts: {1e3 * pred.draft_s:.3f} ms a verify step; the first forward's operators:")
        print_step_ops("draft", pred.draft_ops, sum(t.seconds for t in pred.draft_ops))


def print_step_ops(phase: str, times: list[OpTime], step_s: float) -> None:
    """Each operator of one step: its time, the compute and memory (or link) time it is the max of."""
    ops_s = sum(t.seconds for t in times)
    # under --two-batch-overlap both micro-batches' operators are listed and some run at once
    rest = "the rest fixed overhead" if ops_s <= step_s else "two micro-batches, partly at once"
    print(f"  {phase} operators (step {1e3 * step_s:.3f} ms; operators {1e3 * ops_s:.3f}, {rest}):")
    print(f"    {'operator':<20}{'class':<18}{'ms':>10}{'compute ms':>12}{'memory/link ms':>16}  bound")
    for t in times:
        print(
            f"    {t.op.name:<20}{t.op.op_class:<18}{1e3 * t.seconds:>10.3f}{1e3 * t.compute_s:>12.3f}"
            f"{1e3 * t.memory_s:>16.3f}  {t.bound}"
        )
