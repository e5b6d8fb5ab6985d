"""ModelShape: the numbers of a Hugging Face config.json a step's cost depends on, and where
`--model` finds that config (a path, a recipe config by name, or a random: shape)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from tacit.config.model import layer_sliding_windows
from tacit.loader.multimodal import is_multimodal_wrapper, text_decoder_config
from tacit.perf_model.checkpoint_dtypes import checkpoint_dtypes, gguf_quantization
from tacit.perf_model.dtypes import TensorDtypes, tensor_dtypes

RECIPE_CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # a dense MLP's width (dense layers of a MoE model too)
    vocab_size: int
    tie_word_embeddings: bool
    # MoE (num_experts == 0: dense)
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    num_dense_layers: int = 0  # layers with a dense MLP in a MoE model (first_k_dense_replace, mlp_only_layers)
    # MLA (kv_lora_rank == 0: GQA attention)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    qk_norm: bool = False  # Qwen3, Gemma 3: an RMSNorm per head on q and k
    # Each decoder layer's sliding window, 0 for full attention; empty: every layer full
    # (layer_windows). gpt-oss: 128 on every other layer; Gemma 3: 512/1024 on 5 of every 6.
    windows: tuple[int, ...] = ()
    # DeepSeek-V3.2's sparse attention (index_topk == 0: dense): a lightning indexer of
    # index_n_heads heads of index_head_dim scores every cached token (its own key cache of one
    # index_head_dim row a token and layer); each query attends only to its index_topk best.
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    # The routed experts' stored dtype when the checkpoint fixes it ("mxfp4": gpt-oss, whose
    # quantization_config converts only the experts); "": the --quantization dtype.
    expert_weight_dtype: str = ""
    # The checkpoint's own weight format (checkpoint_dtypes.py: "fp8" for DeepSeek-V3's block
    # fp8, "" unquantized), its lm_head's ("" = bf16) and MLA's kv_b_proj's ("" = the format;
    # "bf16" where its quantization_config excludes it): what --quantization auto prices.
    weight_format: str = ""
    head_weight_dtype: str = ""
    kv_b_weight_dtype: str = ""
    # How alike one sequence's tokens route: measured (tokens, independent draws) points, where
    # T tokens of one sequence read as many distinct experts as `draws` tokens routed at random
    # (perf_model/routing.py measures them). Empty: every token routes independently, the
    # assumption for a trained router with its load balancing. A random model's tokens route
    # alike: 32 tokens of one prompt read 36 of random:qwen3-moe-2b's 128 experts a layer, as
    # many as 5 independent tokens, where 32 independent ones read 112.
    routing_draws: tuple[tuple[float, float], ...] = ()

    def sequence_draws(self, tokens: float) -> float:
        """Independent routing draws `tokens` of one sequence equal: log-log interpolation of
        routing_draws (through 1 token = 1 draw), the last segment's slope beyond it, never
        more than the tokens."""
        if not self.routing_draws or tokens <= 1:
            return tokens
        points = [(1.0, 1.0), *sorted(self.routing_draws)]
        # the first segment that reaches `tokens`, else the last one
        i = next((i for i in range(1, len(points)) if tokens <= points[i][0]), len(points) - 1)
        (t0, d0), (t1, d1) = points[i - 1], points[i]
        slope = math.log(d1 / d0) / math.log(t1 / t0)
        return min(tokens, d0 * (tokens / t0) ** slope)

    def tensor_dtypes(self, weight: str) -> TensorDtypes:
        """Each kind of weight's stored format under --quantization `weight` (dtypes.tensor_dtypes)."""
        return tensor_dtypes(
            weight,
            self.weight_format,
            self.expert_weight_dtype,
            self.head_weight_dtype,
            self.kv_b_weight_dtype,
            self.tie_word_embeddings,
            self.hidden_size,
        )

    @property
    def is_dsa(self) -> bool:
        return self.index_topk > 0

    @property
    def layer_counts(self) -> dict[int, int]:
        """Layers per sliding window (0: full attention), full attention first."""
        counts = {0: self.num_layers - sum(1 for w in self.windows if w)} if self.windows else {0: self.num_layers}
        for w in self.windows:
            if w:
                counts[w] = counts.get(w, 0) + 1
        return {w: n for w, n in counts.items() if n}

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def layer_kind(self) -> str:
        """ "mla" (MLA attention, DeepSeek's), "moe" (GQA with routed experts) or "dense": the
        torch path's fixed cost a layer differs by kind (Profile.decode_path)."""
        return "mla" if self.is_mla else "moe" if self.is_moe else "dense"

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0


def layer_windows(hf: dict) -> tuple[int, ...]:
    """Each decoder layer's sliding window (0: full attention) by the engine's own rule
    (config/model.py layer_sliding_windows); () when every layer is full."""
    windows = layer_sliding_windows(hf)
    return tuple(w or 0 for w in windows) if any(windows) else ()


def shape_from_hf(hf: dict) -> ModelShape:
    """The shape of an HF config dict (Llama/Qwen2/Qwen3 dense, Qwen3-MoE, DeepSeek-V3/Kimi-K2)."""
    quant = hf.get("quantization_config") or {}  # a multimodal wrapper's sits beside its text_config
    if is_multimodal_wrapper(hf):  # its decoder, over the defaults a sparse text_config leaves out
        hf = text_decoder_config(hf)
    elif "text_config" in hf:  # multimodal wrappers keep the decoder here
        hf = {**hf["text_config"], "architectures": hf.get("architectures", [])}
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key not in hf:
            raise ValueError(f"model config has no {key!r}; is it a decoder LLM's config.json?")
    arch = (hf.get("architectures") or ["unknown"])[0]
    h, layers, heads = int(hf["hidden_size"]), int(hf["num_hidden_layers"]), int(hf["num_attention_heads"])
    num_experts = int(hf.get("num_experts") or hf.get("n_routed_experts") or hf.get("num_local_experts") or 0)
    dense_layers = 0
    if num_experts:
        if "first_k_dense_replace" in hf:
            dense_layers = int(hf["first_k_dense_replace"] or 0)
        else:  # Qwen3-MoE: mlp_only_layers, and every decoder_sparse_step-th layer sparse
            step = int(hf.get("decoder_sparse_step") or 1)
            only = set(hf.get("mlp_only_layers") or [])
            dense_layers = sum(1 for i in range(layers) if i in only or (i + 1) % step != 0)
    kv_lora = int(hf.get("kv_lora_rank") or 0)
    fmt, experts_dt, head_dt, kv_b_dt = checkpoint_dtypes(hf.get("quantization_config") or quant, layers)
    # The expert width: moe_intermediate_size where a config has dense layers beside the experts
    # (Qwen3-MoE, DeepSeek); Mixtral and gpt-oss name it intermediate_size (no dense MLP there).
    moe_inter = int(hf.get("moe_intermediate_size") or (hf.get("intermediate_size") if num_experts else 0) or 0)
    return ModelShape(
        architecture=arch,
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads if kv_lora else int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or h // heads),
        intermediate_size=int(hf.get("intermediate_size") or 0),
        vocab_size=int(hf["vocab_size"]),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        num_experts=num_experts,
        top_k=int(hf.get("num_experts_per_tok") or 0) if num_experts else 0,
        moe_intermediate_size=moe_inter,
        num_shared_experts=int(hf.get("n_shared_experts") or 0),
        num_dense_layers=dense_layers,
        kv_lora_rank=kv_lora,
        q_lora_rank=int(hf.get("q_lora_rank") or 0),
        qk_nope_head_dim=int(hf.get("qk_nope_head_dim") or 0),
        qk_rope_head_dim=int(hf.get("qk_rope_head_dim") or 0),
        v_head_dim=int(hf.get("v_head_dim") or 0),
        qk_norm=arch.startswith(("Qwen3", "Gemma3")),
        windows=layer_windows(hf),
        index_n_heads=int(hf.get("index_n_heads") or 0) if hf.get("index_topk") else 0,
        index_head_dim=int(hf.get("index_head_dim") or 0) if hf.get("index_topk") else 0,
        index_topk=int(hf.get("index_topk") or 0),
        expert_weight_dtype=experts_dt if num_experts else "",
        weight_format=fmt,
        head_weight_dtype=head_dt,
        kv_b_weight_dtype=kv_b_dt if kv_lora else "",
    )


def recipe_config_names() -> list[str]:
    return sorted(p.parent.name for p in RECIPE_CONFIGS.glob("*/config.json"))


def load_hf_config(model: str) -> dict:
    """config.json of `model`: a directory or a config.json path, a GGUF file, a recipe config's name
    (recipes/configs/<name>), or random:<shape> (tacit.bench.random_model; no weights built)."""
    if model.startswith("random:"):
        from tacit.bench.random_model import SHAPES

        name = model.removeprefix("random:")
        if name not in SHAPES:
            raise ValueError(f"random model {name!r} is not known; valid: {', '.join('random:' + s for s in SHAPES)}")
        shape = dict(SHAPES[name])
        arch = shape.pop("arch").removesuffix("Config") + "ForCausalLM"
        return {**shape, "architectures": [arch]}
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file() and path.suffix == ".gguf":  # the shape from its metadata, as the loader reads it
        from tacit.loader.gguf_file import GGUFFile

        gguf = GGUFFile(path)
        # and its weights' types, as a quantization_config (checkpoint_dtypes reads it)
        types = {t.name: t.ggml_type for t in gguf.header.tensors}
        return {**gguf.hf_config(), "quantization_config": gguf_quantization(gguf.header.fields, types)}
    if path.is_file():
        return json.loads(path.read_text())
    if (RECIPE_CONFIGS / model / "config.json").is_file():
        return json.loads((RECIPE_CONFIGS / model / "config.json").read_text())
    from tacit.bench.random_model import SHAPES

    valid = recipe_config_names() + ["random:" + s for s in SHAPES]
    raise ValueError(
        f"model {model!r} is neither a config.json, a directory holding one, nor a known name; "
        f"valid names: {', '.join(valid)}"
    )
