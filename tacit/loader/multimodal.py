"""The text decoder of a multimodal checkpoint, loaded as its text-only architecture.

Gemma 3's 4B, 12B and 27B ship as Gemma3ForConditionalGeneration: the decoder's config sits under
`text_config` (sparse: the keys it leaves out take transformers' Gemma3TextConfig defaults, so
the 27B's file names no vocabulary size), its weights under `language_model.model.*` (as released,
transformers 4.50) or `model.language_model.*` (as transformers 5 saves them), beside a vision
tower and a projector that tacit does not run. The decoder is the same as Gemma3ForCausalLM's,
so the checkpoint loads as one: its config flattened, its weights renamed, the image parts never
read. A prompt of text only gives the tokens the full model gives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tacit.loader.shards import Shard

if TYPE_CHECKING:  # annotations only: tacit predict reads configs through this module
    import torch

# transformers 5.25's Gemma3TextConfig defaults: what a sparse text_config leaves to them.
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
}
# wrapper architecture -> (the text architecture that runs its decoder, that decoder's defaults)
TEXT_DECODERS: dict[str, tuple[str, dict[str, Any]]] = {
    "Gemma3ForConditionalGeneration": ("Gemma3ForCausalLM", GEMMA3_TEXT_DEFAULTS),
}
# checkpoint prefix -> the text model's (either era's layout); a name under none is not the decoder's
_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("lm_head.", "lm_head."),
)
# The wrapper's keys that describe the wrapper or its image parts, not the decoder.
_WRAPPER_KEYS = ("architectures", "model_type", "text_config", "vision_config", "auto_map")


def is_multimodal_wrapper(config: dict[str, Any]) -> bool:
    archs = config.get("architectures") or []
    return bool(archs) and archs[0] in TEXT_DECODERS


def text_decoder_config(config: dict[str, Any]) -> dict[str, Any]:
    """The wrapper's config.json as its text architecture's: its defaults, then the wrapper's
    own settings (eos ids, dtype, tied embeddings), then text_config's."""
    text_arch, defaults = TEXT_DECODERS[config["architectures"][0]]
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(
            f"{config['architectures'][0]}: config.json has no text_config object to load the decoder from"
        )
    outer = {k: v for k, v in config.items() if k not in _WRAPPER_KEYS}
    return {**defaults, **outer, **text, "architectures": [text_arch]}


def text_weight_name(name: str) -> str | None:
    """A checkpoint tensor's name in the text model, or None for the vision tower's and the
    projector's."""
    for prefix, to in _PREFIXES:
        if name.startswith(prefix):
            return to + name[len(prefix) :]
    return None


class _ByCheckpointName(Mapping):
    """Shards keyed by the text model's names, looked up by the checkpoint's."""

    def __init__(self, shards: dict[str, Shard]) -> None:
        self.shards = shards

    def __getitem__(self, name: str) -> Shard:
        text = text_weight_name(name)
        if text is None:
            raise KeyError(name)
        return self.shards[text]

    def __contains__(self, name: object) -> bool:
        text = text_weight_name(name) if isinstance(name, str) else None
        return text is not None and text in self.shards

    def __iter__(self) -> Iterator[str]:
        return iter(self.shards)

    def __len__(self) -> int:
        return len(self.shards)


def text_decoder_weights(
    read: Callable[..., Iterator[tuple[str, torch.Tensor]]],
) -> Callable[..., Iterator[tuple[str, torch.Tensor]]]:
    """read(skip=, shards=) over the checkpoint's names -> the same over the text model's: the
    image parts skipped unread, tensor-parallel slices asked for by the text model's names."""

    def weights(
        skip: Callable[[str], bool] | None = None, shards: dict[str, Shard] | None = None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        def skip_name(name: str) -> bool:
            text = text_weight_name(name)
            return text is None or (skip is not None and skip(text))

        for name, tensor in read(skip=skip_name, shards=_ByCheckpointName(shards or {})):
            yield text_weight_name(name), tensor

    return weights
