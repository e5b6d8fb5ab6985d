"""Turn a model (HF directory, .gguf file, a Hugging Face repo id in the local cache, or None for
the default) into config, weights, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from tacit.kernels.ggml_quant import GGMLTensor
from tacit.loader.default_model import resolve_default_model
from tacit.loader.gguf_file import GGUFFile
from tacit.loader.hf import hf_eos_token_ids, hf_sampling_defaults, iter_safetensors, read_json, safetensors_files
from tacit.loader.hf_cache import resolve_model_path
from tacit.loader.multimodal import is_multimodal_wrapper, text_decoder_config, text_decoder_weights
from tacit.loader.prequantized import converted_weights, quant_method, quantized_weight_names
from tacit.loader.shards import narrowed
from tacit.model_config_checks import check_architecture_numbers
from tacit.sampling_params import SamplingParams
from tacit.tokenizer import Tokenizer, read_chat_template


@dataclass
class ModelSource:
    path: Path
    hf_config: dict
    tokenizer: Tokenizer
    eos_token_ids: list[int]
    # Called with no argument; a plain safetensors checkpoint also takes skip=(name -> bool), the
    # tensors never to read (experts streamed from disk, models/expert_streaming.py), and
    # shards={name: (dim, start, length)}, the tensor-parallel slices to read instead of whole
    # tensors (others are narrowed after reading, loader/shards.py).
    weights: Callable[..., Iterator[tuple[str, torch.Tensor | GGMLTensor]]]
    # {HF weight name: GGML type id} of the weights `weights` yields still quantized (a GGUF's
    # blocks, a GPTQ / AWQ checkpoint's layers converted to Q4_1, an FP8 one's to FP8_E4M3).
    quantized_weights: dict[str, int] = field(default_factory=dict)


def open_model(
    model: str | Path | None,
    tokenizer: str | None = None,
    chat_template: str | None = None,
) -> ModelSource:
    """The model at `model` (None: the default model), with another tokenizer directory or chat
    template (a file or the template itself) if given."""
    source = _open_model(model, tokenizer)
    if chat_template is not None:
        source.tokenizer = source.tokenizer.with_chat_template(read_chat_template(chat_template))
    return source


def _other_tokenizer(directory: str, hf_config: dict) -> Tokenizer:
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer={directory!r} is not a directory; pass one holding tokenizer.json")
    tok = Tokenizer.from_hf_dir(path)
    vocab = hf_config.get("vocab_size")
    if isinstance(vocab, int) and tok.vocab_size > vocab:
        raise ValueError(
            f"tokenizer={directory!r} has {tok.vocab_size} tokens but the model embeds {vocab}: "
            f"ids past {vocab - 1} would index no embedding row; pass the tokenizer this model was trained with"
        )
    return tok


def sampling_defaults(path: Path, generation_config: str = "auto") -> dict[str, float | int]:
    """The sampling values requests fall back to, as vLLM's --generation-config: auto (the model
    directory's generation_config.json; a GGUF has none), vllm (none) or a folder holding one.
    Validated here, so a bad value fails at start-up naming the file, not in each request omitting it."""
    if generation_config == "vllm":
        return {}
    if generation_config == "auto":
        folder = path
        defaults = {} if path.is_file() else hf_sampling_defaults(path)
    else:
        folder = Path(generation_config).expanduser()
        if not (folder / "generation_config.json").is_file():
            raise FileNotFoundError(
                f"generation_config={generation_config!r}: no generation_config.json there; valid: auto (the "
                f"model's), vllm (none: OpenAI's defaults) or a folder holding a generation_config.json"
            )
        defaults = hf_sampling_defaults(folder)
    try:
        SamplingParams.from_model_defaults(defaults)
    except ValueError as e:
        raise ValueError(f"{folder / 'generation_config.json'}: {e}") from None
    return defaults


def _open_model(model: str | Path | None, tokenizer: str | None) -> ModelSource:
    # Resolved here, once: every command and LLM() take a repo id, and the engine's config (and
    # so each worker, which opens config.model.path) carries the local path it resolved to.
    path = resolve_default_model() if model is None else resolve_model_path(model)
    if not path.exists():
        raise FileNotFoundError(
            f"model path {str(path)!r} does not exist; pass a Hugging Face model directory (config.json + "
            f"*.safetensors), a .gguf file, or a Hugging Face repo id in the local cache (ORG/NAME, ORG/NAME:TAG)"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(
                f"model file {str(path)!r} is not a .gguf file; a single-file model must be GGUF, "
                f"anything else must be a Hugging Face directory"
            )
        gguf = GGUFFile(path)
        tok = _other_tokenizer(tokenizer, gguf.hf_config()) if tokenizer else gguf.tokenizer()
        eos = gguf.eos_token_ids() or ([tok.eos_token_id] if tok.eos_token_id is not None else [])
        return ModelSource(
            path,
            gguf.hf_config(),
            tok,
            eos,
            lambda shards=None: narrowed(gguf.tensors(), shards or {}),
            gguf.quantized_weights(),
        )
    config_file = path / "config.json"
    if not config_file.exists():
        raise FileNotFoundError(
            f"{path} has no config.json; a Hugging Face model directory needs config.json, "
            f"*.safetensors and tokenizer.json"
        )
    config = read_json(config_file)
    # Before anything reads the config (a list once ended in an AttributeError), naming the file.
    check_architecture_numbers(str(config_file), config)
    method = quant_method(path, config)
    # --tokenizer: a checkpoint without tokenizer files (or with another tokenizer) takes one from elsewhere.
    tok = _other_tokenizer(tokenizer, config) if tokenizer else Tokenizer.from_hf_dir(path)
    eos = hf_eos_token_ids(path, config) or ([tok.eos_token_id] if tok.eos_token_id is not None else [])
    if is_multimodal_wrapper(config):  # its text decoder, loaded as the text architecture (loader/multimodal.py)
        if method is not None:
            raise ValueError(
                f"{config_file}: a quantized ({method}) multimodal checkpoint's text decoder is not loaded yet"
            )
        read = text_decoder_weights(lambda skip=None, shards=None: iter_safetensors(path, skip, shards))
        return ModelSource(path, text_decoder_config(config), tok, eos, read)
    if method is None:
        return ModelSource(path, config, tok, eos, lambda skip=None, shards=None: iter_safetensors(path, skip, shards))
    # GPTQ / AWQ: each layer's packed 4-bit tensors arrive as one GGMLTensor of Q4_1 blocks; FP8:
    # each weight and its block scales as one of FP8_E4M3 blocks; MXFP4 (gpt-oss): each expert
    # stack's _blocks and _scales as GGMLExpertStacks of MXFP4 blocks; kept or dequantized as a
    # GGUF's are (--quantization auto | gguf | none).
    return ModelSource(
        path,
        config,
        tok,
        eos,
        lambda shards=None: narrowed(converted_weights(iter_safetensors(path), method, config), shards or {}),
        quantized_weight_names(safetensors_files(path), method),
    )
