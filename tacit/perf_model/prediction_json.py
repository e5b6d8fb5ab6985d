"""`tacit predict --json FILE`: the prediction as data other code reads (keys named in
docs/perf-model.md): the inputs echoed, the headline figures, every operator of the prefill and
decode steps, and one device's memory."""

from __future__ import annotations

import argparse
import dataclasses

from tacit.perf_model.layout import nodes
from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.predict import Prediction, Workload
from tacit.perf_model.roofline import OpTime
from tacit.platforms.specs import HardwareSpec


def op_rows(times: list[OpTime]) -> list[dict]:
    """One row per operator: its time, the compute and memory (or link) time it is the max of
    (plus its launches' overhead), its counts and which roof binds it."""
    return [
        {
            "name": t.op.name,
            "class": t.op.op_class,
            "ms": 1e3 * t.seconds,
            "compute_ms": 1e3 * t.compute_s,
            "memory_ms": 1e3 * t.memory_s,
            "flops": t.op.flops,
            "bytes": t.op.bytes,
            "bound": t.bound,
        }
        for t in times
    ]


def fixed_overhead_ms(step_s: float, times: list[OpTime]) -> float:
    """The step's time beyond its operators': the engine's fixed cost per step and per layer;
    under --two-batch-overlap less what the overlap hides (both micro-batches' operators are
    listed, some running at once), so it can be negative."""
    return 1e3 * (step_s - sum(t.seconds for t in times)) if times else 0.0


def inputs_of(args: argparse.Namespace) -> dict:
    """Every flag of the command and its value as parsed (the command's function left out)."""
    return {k: v for k, v in sorted(vars(args).items()) if not callable(v)}


def workload_of(work: Workload) -> dict:
    """The workload as predicted: the flags resolved (dtypes normalised, the layout, the cached
    share of each prompt, the decode step's context)."""
    return {
        # at a request rate the concurrency follows from it (the prediction's open_loop), not --batch-size
        "batch": work.batch if work.request_rate is None else None,
        "request_rate": work.request_rate,
        "input_len": work.input_len,
        "cached_tokens": work.cached_tokens,
        "output_len": work.output_len,
        "decode_context": work.decode_context,
        "kv_tokens": work.kv_tokens,
        "weight_dtype": work.weight_dtype,
        "kv_dtype": work.kv_dtype,
        "parallel": dataclasses.asdict(work.parallel),  # as asked; "layout" below: as resolved
    }


def prediction_json(
    pred: Prediction, work: Workload, spec: HardwareSpec, shape: ModelShape, args: argparse.Namespace
) -> dict:
    devices = pred.layout.devices  # the layout as predict resolved and placed it (layout.py)
    per_node = pred.layout.devices_per_node
    mem = pred.memory
    prompt_tokens = work.batch * work.input_len
    out = pred.as_json()
    out.update(
        {
            "inputs": inputs_of(args),
            "hardware": {
                "name": spec.name,
                "description": spec.description,
                "devices_per_node": per_node,
                "efficiency_profile": spec.efficiency_profile,
                "cores": spec.cores,
            },
            "model": {"name": args.model, "architecture": shape.architecture},
            "workload": workload_of(work),
            "at_context": pred.at_context,
            "ttft": pred.ttft.as_json() if pred.ttft is not None else None,
            "throughput_tok_s_per_device": pred.throughput_tok_s / devices,
            # the batch's prompt tokens over the time its last one took to prefill
            "prefill_tok_s": prompt_tokens / pred.ttft.max_s if pred.ttft is not None else None,
            "devices": devices,
            "layout": dataclasses.asdict(pred.layout),
            "nodes": nodes(pred.layout),
            "speculative": {
                "method": work.speculative_method,
                "tokens": work.speculative_tokens,
                "acceptance": work.acceptance,
                "tokens_per_verify": work.tokens_per_verify,
                "draft_ms": 1e3 * pred.draft_s,
            }
            if work.speculative_tokens
            else None,
            # one device's, in bytes (as the operator rows' bytes; memory_per_device_gb is total / 1e9)
            "memory": {
                "weights": mem.weights,
                "kv_cache": mem.kv_cache,
                "activations": mem.activations,
                "total": mem.total,
                "capacity": pred.capacity_bytes,
                "fits": pred.fits,
            },
            "prefill_ops": op_rows(pred.prefill_ops),
            "prefill_fixed_overhead_ms": fixed_overhead_ms(pred.prefill_step_s, pred.prefill_ops),
            "decode_ops": op_rows(pred.decode_ops),
            "decode_fixed_overhead_ms": fixed_overhead_ms(pred.decode_step_s, pred.decode_ops),
            "draft_ops": op_rows(pred.draft_ops),
        }
    )
    return out
