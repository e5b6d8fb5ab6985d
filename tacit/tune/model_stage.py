"""The model-only stage of `tacit tune`: every candidate configuration run through the serve
simulator (perf_model.serve_sim: the engine's own Scheduler on a simulated clock, each step priced
by the performance model) on the scenario's requests, in a fraction of a second each. Its
ranking picks what the measured stage tries first; with --hardware NAME (a machine we do not
have) it is the whole answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tacit.config import SchedulerConfig
from tacit.config.engine_args import EngineArgs
from tacit.config.model import model_max_len
from tacit.perf_model.calibration import profile_for
from tacit.perf_model.fit_host import priced_dtypes
from tacit.perf_model.hardware_file import resolve_hardware
from tacit.perf_model.layout import place, resolve_layout
from tacit.perf_model.model_shape import load_hf_config, shape_from_hf
from tacit.perf_model.op_types import Parallel
from tacit.perf_model.serve_sim import KVPool, kv_pool_from_memory, roofline_pricer, simulate
from tacit.perf_model.step_model import Pricing
from tacit.tune.objective import RequestOutcome, objective_value, score
from tacit.tune.scenario import Scenario
from tacit.tune.space import validate_point

# vLLM's gpu_memory_utilization default: the share of a device's memory the KV pool may take
# after the weights and activations, where the configuration does not size the pool itself.
MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class Prediction:
    point: dict[str, Any]
    scores: dict[str, float] | None  # None: the configuration cannot run (error says why)
    value: float  # objective_value of scores; -inf where it cannot run
    error: str = ""


class ModelStage:
    """Prices configurations of `base` (its model) on `hardware` for one scenario."""

    def __init__(self, base: EngineArgs, model: str, scenario: Scenario, objective: str, hardware: str = "this-cpu"):
        self.base, self.scenario, self.objective = base, scenario, objective
        self.spec = resolve_hardware(hardware, None, False)
        self.hf = load_hf_config(model)
        self.shape = shape_from_hf(self.hf)
        self.profile = profile_for(self.spec)  # this-cpu: its cached calibration (fitted once, ~1 min)
        self.longest = max(w.input_len + w.output_len for w in scenario.workload)

    def _pricing(self, args: EngineArgs) -> Pricing:
        par = Parallel(
            tp=args.tensor_parallel_size,
            ep=args.expert_parallel,
            dp_attention=args.data_parallel_attention,
            two_batch_overlap=args.two_batch_overlap,
        )
        par, spec = place(resolve_layout(par, self.shape), self.spec)
        # the engine's dtypes on this-cpu: float32 weights and KV where bf16 is not native
        weights, kv = priced_dtypes(spec, args.quantization or "auto", args.kv_cache_dtype, self.shape.weight_format)
        group = args.quantization_group_size or 32
        # the engine's block size: where its decodes run on torch_paged, each group pads to its longest context
        return Pricing(self.shape, spec, self.profile, weights, kv, group, par, padded_decode_block=args.block_size)

    def scheduler_config(self, args: EngineArgs) -> SchedulerConfig:
        """The scheduler the engine of args builds for this model. Its budget as the engine
        resolves it: without chunked prefill, raised to the model's max_model_len (8192 for the
        default model), not to the workload's longest request; a configuration of 2,433 tokens
        a step ran steps of 5,426 and 8,170 prompt tokens on the bursty scenario; priced as
        steps of at most 2,433, it ranked among the best three of 12 and measured next to last."""
        max_len = model_max_len(self.hf, args.max_model_len)
        if max_len < self.longest:  # tune.measure's _too_long: the engine would refuse it
            raise ValueError(
                f"the workload's longest request needs {self.longest} tokens, more than this "
                f"configuration's max_model_len {max_len}"
            )
        return args.create_scheduler_config(max_len)

    def predict(self, point: dict[str, Any]) -> Prediction:
        try:
            args = validate_point(point, self.base)
            sched = self.scheduler_config(args)
            pricing = self._pricing(args)
            block = args.block_size
            if args.num_kv_blocks is not None:
                pool = KVPool(args.num_kv_blocks, block)
            else:
                workload = self.scenario.workload
                pool = kv_pool_from_memory(pricing, sched.max_num_batched_tokens, MEMORY_UTILIZATION, block, workload)
            # Cut-ins happen at layer boundaries in one process (engine/executor.py), none across ranks.
            boundaries = self.shape.num_layers if pricing.parallel.tp == 1 else 1
            sim = simulate(self.scenario.workload, roofline_pricer(pricing), pool, sched, None, boundaries)
        except ValueError as e:
            return Prediction(point, None, float("-inf"), str(e))
        outcomes = [
            RequestOutcome(w.priority, r.ok, r.ttft, r.e2e, r.output_tokens)
            for w, r in zip(self.scenario.workload, sim.results)
        ]
        scores = score(outcomes, self.scenario.slo, max(sim.duration_s, 1e-9))
        return Prediction(point, scores, objective_value(scores, self.objective))
