"""Tiny random SDXL / SD 1.5 checkpoints written the two ways users have them, for tests.

- write_diffusers_dir: diffusers' own save_pretrained of a StableDiffusion(XL)Pipeline
  (model_index.json, unet/, vae/, text_encoder/, tokenizer/, ... as on the hub).
- write_single_file: the same weights under the original SGM/LDM key names in one .safetensors,
  written by the reverse of diffusers' single-file conversion (below, from the key layout of
  Stability's sgm repo: input_blocks/middle_block/output_blocks, first_stage_model, conditioner).
- write_clip_tokenizer: a CLIP BPE tokenizer over a 60-entry vocabulary (letters, a few merges,
  <|startoftext|>, <|endoftext|> as the largest id so CLIP's argmax pooling finds it).
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

import torch

from tacit.diffusion.architectures import get_arch


def write_clip_tokenizer(path: Path, max_length: int, pad_token: str = "<|endoftext|>"):
    from transformers import CLIPTokenizer

    path.mkdir(parents=True, exist_ok=True)
    letters = list(string.ascii_lowercase)
    tokens = letters + [c + "</w>" for c in letters] + ["!", "!</w>", "th", "the</w>", "ca", "cat</w>"]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (path / "merges.txt").write_text("#version: 0.2\nt h\nth e</w>\nc a\nca t</w>\n")
    tok = CLIPTokenizer(
        str(path / "vocab.json"), str(path / "merges.txt"), model_max_length=max_length, pad_token=pad_token
    )
    tok.save_pretrained(path)
    return CLIPTokenizer.from_pretrained(path)


def build_tiny(arch_name: str, seed: int = 0) -> dict:
    """Random float32 components of the tiny architecture: {"unet", "vae", "text_encoder", ...}."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    arch = get_arch(arch_name)
    torch.manual_seed(seed)
    modules = {
        "unet": UNet2DConditionModel.from_config(arch["unet"]),
        "vae": AutoencoderKL.from_config(arch["vae"]),
        "text_encoder": CLIPTextModel(CLIPTextConfig(**arch["text_encoder"])),
    }
    if arch["text_encoder_2"] is not None:
        modules["text_encoder_2"] = CLIPTextModelWithProjection(CLIPTextConfig(**arch["text_encoder_2"]))
    return {k: m.eval() for k, m in modules.items()}


def write_diffusers_dir(path: Path, arch_name: str, seed: int = 0, variant: str | None = None) -> dict:
    """Save the tiny model as a diffusers pipeline directory; returns the diffusers pipeline."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    arch = get_arch(arch_name)
    modules = build_tiny(arch_name, seed)
    scheduler = EulerDiscreteScheduler.from_config({k: v for k, v in arch["scheduler"].items() if k != "_class_name"})
    tok = write_clip_tokenizer(path.parent / f"{path.name}-tok", arch["tokenizer_max_length"])
    if arch["family"] == "sdxl":
        tok2 = write_clip_tokenizer(path.parent / f"{path.name}-tok2", arch["tokenizer_max_length"], pad_token="!")
        pipe = StableDiffusionXLPipeline(tokenizer=tok, tokenizer_2=tok2, scheduler=scheduler, **modules)
    else:
        pipe = StableDiffusionPipeline(
            tokenizer=tok,
            scheduler=scheduler,
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
            **modules,
        )
    pipe.save_pretrained(path, variant=variant)
    return pipe


# ---- diffusers -> SGM/LDM key names (the reverse of diffusers.loaders.single_file_utils) ----

_RESNET = [
    ("norm1", "in_layers.0"),
    ("conv1", "in_layers.2"),
    ("norm2", "out_layers.0"),
    ("conv2", "out_layers.3"),
    ("time_emb_proj", "emb_layers.1"),
    ("conv_shortcut", "skip_connection"),
]
_UNET_TOP = {
    "time_embedding.linear_1": "time_embed.0",
    "time_embedding.linear_2": "time_embed.2",
    "conv_in": "input_blocks.0.0",
    "conv_norm_out": "out.0",
    "conv_out": "out.2",
    "add_embedding.linear_1": "label_emb.0.0",
    "add_embedding.linear_2": "label_emb.0.2",
}


def unet_to_sgm(state: dict, config: dict) -> dict:
    per = config["layers_per_block"] + 1  # an SGM input/output level: L resnets (+attention) and a resampler
    has_attn = ["CrossAttn" in t for t in config["up_block_types"]]
    out = {}
    for key, value in state.items():
        head, _, leaf = key.rpartition(".")
        if head in _UNET_TOP:
            new = f"{_UNET_TOP[head]}.{leaf}"
        elif m := re.match(r"down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
            new = f"input_blocks.{per * int(m[1]) + int(m[2]) + 1}.0.{_rename(m[3], _RESNET)}"
        elif m := re.match(r"down_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", key):
            new = f"input_blocks.{per * int(m[1]) + int(m[2]) + 1}.1.{m[3]}"
        elif m := re.match(r"down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)", key):
            new = f"input_blocks.{per * (int(m[1]) + 1)}.0.op.{m[2]}"
        elif m := re.match(r"mid_block\.resnets\.(\d+)\.(.*)", key):
            new = f"middle_block.{2 * int(m[1])}.{_rename(m[2], _RESNET)}"
        elif m := re.match(r"mid_block\.attentions\.0\.(.*)", key):
            new = f"middle_block.1.{m[1]}"
        elif m := re.match(r"up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", key):
            new = f"output_blocks.{per * int(m[1]) + int(m[2])}.0.{_rename(m[3], _RESNET)}"
        elif m := re.match(r"up_blocks\.(\d+)\.attentions\.(\d+)\.(.*)", key):
            new = f"output_blocks.{per * int(m[1]) + int(m[2])}.1.{m[3]}"
        elif m := re.match(r"up_blocks\.(\d+)\.upsamplers\.0\.(.*)", key):
            i = int(m[1])
            new = f"output_blocks.{per * i + per - 1}.{2 if has_attn[i] else 1}.{m[2]}"
        else:
            raise KeyError(f"no SGM name for UNet key {key}")
        out["model.diffusion_model." + new] = value
    return out


def vae_to_sgm(state: dict, config: dict) -> dict:
    n = len(config["up_block_types"])
    attn = [("group_norm", "norm"), ("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")]
    out = {}
    for key, value in state.items():
        new = key.replace("conv_shortcut", "nin_shortcut").replace("conv_norm_out", "norm_out")
        if m := re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)", new):
            new = f"{m[1]}.mid.attn_1.{_rename(m[2], attn)}"
            if value.ndim == 2:  # SGM keeps the attention projections as 1x1 convolutions
                value = value[:, :, None, None]
        elif m := re.match(r"(encoder|decoder)\.mid_block\.resnets\.(\d+)\.(.*)", new):
            new = f"{m[1]}.mid.block_{int(m[2]) + 1}.{m[3]}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", new):
            new = f"encoder.down.{m[1]}.block.{m[2]}.{m[3]}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)", new):
            new = f"encoder.down.{m[1]}.downsample.{m[2]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)", new):
            new = f"decoder.up.{n - 1 - int(m[1])}.block.{m[2]}.{m[3]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)", new):
            new = f"decoder.up.{n - 1 - int(m[1])}.upsample.{m[2]}"
        out["first_stage_model." + new] = value
    return out


def clip_to_sgm(state: dict, prefix: str) -> dict:
    out = {prefix + "text_model." + k.removeprefix("text_model."): v for k, v in state.items()}
    # Older exports carry CLIP's position_ids buffer; the loader must drop it.
    out[prefix + "text_model.embeddings.position_ids"] = torch.arange(state[_pos_key(state)].shape[0])[None]
    return out


def _pos_key(state: dict) -> str:
    return next(k for k in state if k.endswith("position_embedding.weight"))


def open_clip_to_sgm(state: dict, prefix: str = "conditioner.embedders.1.model.") -> dict:
    inner = [
        ("self_attn.out_proj", "attn.out_proj"),
        ("layer_norm1", "ln_1"),
        ("layer_norm2", "ln_2"),
        ("mlp.fc1", "mlp.c_fc"),
        ("mlp.fc2", "mlp.c_proj"),
    ]
    out = {}
    for key, value in state.items():
        k = key.removeprefix("text_model.")
        if k == "embeddings.token_embedding.weight":
            out[prefix + "token_embedding.weight"] = value
        elif k == "embeddings.position_embedding.weight":
            out[prefix + "positional_embedding"] = value
        elif k.startswith("final_layer_norm."):
            out[prefix + "ln_final." + k.split(".")[-1]] = value
        elif k == "text_projection.weight":
            out[prefix + "text_projection"] = value.T.contiguous()  # OpenCLIP multiplies x @ P
        elif m := re.match(r"encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", k):
            if m[2] == "q":  # OpenCLIP fuses q, k, v into one in_proj
                parts = [state[key.replace("q_proj", f"{p}_proj")] for p in "qkv"]
                out[f"{prefix}transformer.resblocks.{m[1]}.attn.in_proj_{m[3]}"] = torch.cat(parts)
        elif m := re.match(r"encoder\.layers\.(\d+)\.(.*)", k):
            out[f"{prefix}transformer.resblocks.{m[1]}.{_rename(m[2], inner)}"] = value
        else:
            raise KeyError(f"no OpenCLIP name for {key}")
    return out


def _rename(rest: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        if rest.startswith(old + "."):
            return new + rest[len(old) :]
    return rest


def write_single_file(path: Path, modules: dict, arch_name: str, dtype: torch.dtype = torch.float32) -> None:
    """The modules' weights under SGM/LDM names in one .safetensors (fp16 like most published files)."""
    from safetensors.torch import save_file

    arch = get_arch(arch_name)
    state = {}
    state.update(unet_to_sgm(modules["unet"].state_dict(), arch["unet"]))
    state.update(vae_to_sgm(modules["vae"].state_dict(), arch["vae"]))
    if arch["family"] == "sdxl":
        state.update(clip_to_sgm(modules["text_encoder"].state_dict(), "conditioner.embedders.0.transformer."))
        state.update(open_clip_to_sgm(modules["text_encoder_2"].state_dict()))
    else:
        state.update(clip_to_sgm(modules["text_encoder"].state_dict(), "cond_stage_model.transformer."))
    save_file({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in state.items()}, str(path))
