"""A deployment's layout checked against itself and the model, and resolved into what the
operator model prices: one replica's Parallel, placed on the hardware's nodes.

--data-parallel-size D means two things, as in vLLM: with expert parallelism over a MoE model,
D attention groups share one stage's experts (DP attention + EP); otherwise D independent
replicas, the batch split over them.
"""

from __future__ import annotations

from dataclasses import replace

from tacit.perf_model.model_shape import ModelShape
from tacit.perf_model.op_types import A2A_BACKENDS, ALL_REDUCE_ALGORITHMS, DEEPEP_MODES, Parallel
from tacit.platforms.specs import HardwareSpec


def _positive(value: object, flag: str, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{flag} must be an integer >= {least}, got {value!r}")


def _check_self(par: Parallel) -> None:
    """What the flags must satisfy whatever the model."""
    _positive(par.tp, "--tensor-parallel-size")
    _positive(par.dp, "--data-parallel-size")
    _positive(par.pp, "--pipeline-parallel-size")
    _positive(par.replicas, "replicas")
    _positive(par.ep_size, "--expert-parallel-size", 0)
    _positive(par.dense_tp, "--moe-dense-tp-size", 0)
    _positive(par.redundant_experts, "--num-redundant-experts", 0)
    _positive(par.devices_per_node, "--devices-per-node", 0)
    if par.dp_attention and par.tp < 2:
        raise ValueError("--data-parallel-attention needs --tensor-parallel-size >= 2: it spreads sequences over them")
    for value, valid, flag in (
        (par.a2a_backend, ("", *A2A_BACKENDS), "--moe-a2a-backend"),
        (par.deepep_mode, DEEPEP_MODES, "--deepep-mode"),
        (par.all_reduce_algorithm, ALL_REDUCE_ALGORITHMS, "--all-reduce-algorithm"),
    ):
        if value not in valid:
            raise ValueError(f"{flag} {value!r} is not known; valid: {', '.join(v for v in valid if v)}")
    if par.expert_load_imbalance and par.expert_load_imbalance < 1:
        raise ValueError(
            f"--expert-load-imbalance {par.expert_load_imbalance} is invalid: the busiest rank's load over the "
            "mean is >= 1"
        )
    if not par.ep:
        for value, flag in (
            (par.ep_size, "--expert-parallel-size"),
            (par.redundant_experts, "--num-redundant-experts"),
        ):
            if value:
                raise ValueError(f"{flag} needs --enable-expert-parallel (experts split whole)")
    s = par.stage_devices
    if par.ep_size and s % par.ep_size:
        raise ValueError(
            f"--expert-parallel-size {par.ep_size} must divide a stage's {s} devices "
            f"(--tensor-parallel-size {par.tp} x --data-parallel-size {par.dp}); the rest is TP inside each expert"
        )
    if par.dense_tp:
        na = par.attention_tp
        if s % par.dense_tp or (par.dense_tp % na and na % par.dense_tp):
            raise ValueError(
                f"--moe-dense-tp-size {par.dense_tp} must divide a stage's {s} devices and divide, or be a multiple "
                f"of, the attention group's {na}"
            )
    if par.dp_lm_head and par.attention_ranks == 1:
        raise ValueError(
            "--enable-dp-lm-head needs data-parallel attention (--data-parallel-attention, or --data-parallel-size "
            "> 1 with expert parallel): with one attention group the head already splits inside it"
        )


def _check_model(par: Parallel, s: ModelShape) -> None:
    na = par.attention_tp
    if s.num_heads % na:
        raise ValueError(
            f"--tensor-parallel-size {na} must divide the model's {s.num_heads} attention heads "
            "(or use --data-parallel-attention)"
        )
    if not s.is_mla and s.num_kv_heads >= na and s.num_kv_heads % na:
        raise ValueError(f"--tensor-parallel-size {na} must divide the model's {s.num_kv_heads} KV heads")
    if par.pp > s.num_layers:
        raise ValueError(f"--pipeline-parallel-size {par.pp} exceeds the model's {s.num_layers} layers")
    if par.ep and not s.is_moe:
        raise ValueError("--enable-expert-parallel needs a MoE model; this one has no experts")
    if par.ep:
        ranks, slots = par.expert_ranks, s.num_experts + par.redundant_experts
        if ranks > slots:
            raise ValueError(
                f"expert parallel over {ranks} ranks (--expert-parallel-size) exceeds the model's {s.num_experts} "
                f"experts + {par.redundant_experts} redundant (--num-redundant-experts): a rank would hold none"
            )
    if par.backend == "deepep":
        if not (s.is_moe and par.ep) or par.expert_tp != 1:
            raise ValueError(
                "--moe-a2a-backend deepep sends tokens to whole experts: it needs --enable-expert-parallel over every "
                "device of a stage (--expert-parallel-size = --tensor-parallel-size x --data-parallel-size)"
            )


def resolve_layout(par: Parallel, s: ModelShape) -> Parallel:
    """The layout checked, with data-parallel ranks that share nothing (a dense model, or MoE
    without EP) turned into replicas."""
    _check_self(par)
    if par.dp > 1 and not (s.is_moe and par.ep):
        par = replace(par, replicas=par.replicas * par.dp, dp=1)
        _check_self(par)  # the dense group, the head: now within one replica
    _check_model(par, s)
    return par


def place(par: Parallel, spec: HardwareSpec) -> tuple[Parallel, HardwareSpec]:
    """--devices-per-node overrides the hardware's; otherwise the layout takes the hardware's. A
    part listed without a network (one device a node and no inter-node figures) is taken to
    reach every peer over its own links: one node of the whole deployment."""
    if par.devices_per_node:
        spec = replace(spec, devices_per_node=par.devices_per_node)
    elif spec.devices_per_node == 1 and spec.inter_node_bandwidth is None:
        spec = replace(spec, devices_per_node=par.devices)
    return replace(par, devices_per_node=spec.devices_per_node), spec


def nodes(par: Parallel) -> int:
    """Nodes the whole deployment spans (ceil(devices / devices a node))."""
    return -(-par.devices // max(par.devices_per_node, 1))
