"""`tacit predict`'s layout flags (vLLM's names first, SGLang's where vLLM has none) and the
Parallel they describe; perf_model/layout.py checks it against the model."""

from __future__ import annotations

import argparse

from tacit.perf_model.op_types import A2A_BACKENDS, ALL_REDUCE_ALGORITHMS, DEEPEP_MODES, Parallel


def add_layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout (per part; every default splits like --tensor-parallel-size)")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="devices of one attention group (a DP rank)")
    g.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="MoE with expert parallel: attention groups sharing the experts; otherwise independent replicas "
        "(the batch split over them, throughput summed)",
    )
    g.add_argument(
        "--data-parallel-attention",
        "--enable-dp-attention",
        dest="data_parallel_attention",
        action="store_true",
        help="attention whole on each TP device over 1/N of the sequences (their KV only); MLPs, experts, "
        "embedding and head split over every device",
    )
    g.add_argument(
        "--enable-expert-parallel",
        "--expert-parallel",
        dest="expert_parallel",
        action="store_true",
        help="MoE experts split whole across the devices of a stage",
    )
    g.add_argument(
        "--expert-parallel-size",
        type=int,
        default=0,
        help="ranks the experts split over (default: every device of a stage); the rest is TP inside each expert",
    )
    g.add_argument(
        "--moe-dense-tp-size",
        type=int,
        default=0,
        help="TP size of dense MLP layers (default: the attention group; every device under DP attention)",
    )
    g.add_argument(
        "--enable-dp-lm-head", action="store_true", help="the head vocab-parallel inside the attention group"
    )
    g.add_argument("--pipeline-parallel-size", type=int, default=1, help="pipeline stages (layers split)")
    g.add_argument(
        "--num-redundant-experts", type=int, default=0, help="EPLB's extra expert copies (EP need not divide E)"
    )
    g.add_argument(
        "--expert-load-imbalance",
        type=float,
        default=0.0,
        help="the busiest EP rank's routed tokens over the mean (>= 1; default derived from the batch)",
    )
    g.add_argument(
        "--moe-a2a-backend",
        default="",
        help=f"{' | '.join(A2A_BACKENDS)} (default: deepep when experts span attention groups; allgather is "
        "tacit's engine: the global batch gathered, reduce-scattered after)",
    )
    g.add_argument("--deepep-mode", default="auto", help=f"{' | '.join(DEEPEP_MODES)} (auto: low_latency decode)")
    g.add_argument("--two-batch-overlap", action="store_true", help="two micro-batches, communication overlapped")
    g.add_argument(
        "--all-reduce-algorithm",
        default="auto",
        help=f"{' | '.join(ALL_REDUCE_ALGORITHMS)} (auto: the fastest per message, as NCCL / custom all-reduce)",
    )
    g.add_argument("--devices-per-node", type=int, default=0, help="overrides the hardware's (nodes = ceil(N / K))")


def layout_from_args(args: argparse.Namespace) -> Parallel:
    return Parallel(
        tp=args.tensor_parallel_size,
        ep=args.expert_parallel,
        dp_attention=args.data_parallel_attention,
        dp=args.data_parallel_size,
        ep_size=args.expert_parallel_size,
        dense_tp=args.moe_dense_tp_size,
        dp_lm_head=args.enable_dp_lm_head,
        pp=args.pipeline_parallel_size,
        redundant_experts=args.num_redundant_experts,
        expert_load_imbalance=args.expert_load_imbalance,
        a2a_backend=args.moe_a2a_backend,
        deepep_mode=args.deepep_mode,
        two_batch_overlap=args.two_batch_overlap,
        all_reduce_algorithm=args.all_reduce_algorithm,
        devices_per_node=args.devices_per_node,
    )


def describe_layout(par: Parallel) -> str:
    """The heading's words for a resolved layout: only what differs from one group of TP."""
    parts = [f"TP={par.tp}"]
    if par.ep:
        parts.append(f"EP={par.expert_ranks}" + (f" (TP {par.expert_tp} in experts)" if par.expert_tp > 1 else ""))
    if par.dp_attention:
        parts.append("DP-attention")
    if par.dp > 1:
        parts.append(f"DP={par.dp}")
    if par.pp > 1:
        parts.append(f"PP={par.pp}")
    if par.replicas > 1:
        parts.append(f"{par.replicas} replicas")
    if par.ep:
        parts.append(f"MoE via {par.backend}")
    if par.two_batch_overlap:
        parts.append("TBO")
    return " ".join(parts)
