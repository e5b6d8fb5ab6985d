"""Loading tiny SDXL / SD 1.5 checkpoints as users have them: a diffusers directory (plain or fp16-variant
file names) and a single-file SGM/LDM .safetensors; and the clear errors for what is missing or broken."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from tiny_diffusion import write_diffusers_dir, write_single_file

from tacit.diffusion import loader
from tacit.diffusion.architectures import get_arch
from tacit.diffusion.loader import load_components
from tacit.diffusion.pipeline import ImagePipeline
from tacit.diffusion.request import ImageRequest

MODULES = ("unet", "vae", "text_encoder", "text_encoder_2")


@pytest.fixture(scope="module", params=["tiny_sdxl", "tiny_sd15"])
def written(request, tmp_path_factory):
    """(arch name, diffusers dir, single file, the diffusers pipeline both were written from)."""
    root = tmp_path_factory.mktemp(request.param)
    ref = write_diffusers_dir(root / "model", request.param)
    modules = {name: getattr(ref, name) for name in MODULES if getattr(ref, name, None) is not None}
    write_single_file(root / "model.safetensors", modules, request.param)
    return request.param, root / "model", root / "model.safetensors", ref


def _same_weights(components, ref) -> None:
    for name in MODULES:
        ours = getattr(components, name)
        if getattr(ref, name, None) is None:
            assert ours is None
            continue
        theirs = getattr(ref, name).state_dict()
        mine = ours.state_dict()
        assert set(mine) == set(theirs), name
        for key, value in theirs.items():
            assert torch.equal(mine[key], value), f"{name}.{key}"


def test_diffusers_dir_and_single_file_load_the_same_model(written):
    arch_name, directory, single, ref = written
    from_dir = load_components(directory)
    from_file = load_components(single, tokenizer_dir=directory, arch=get_arch(arch_name))
    assert from_dir.family == from_file.family == get_arch(arch_name)["family"]
    assert from_dir.force_zeros_for_empty_prompt == from_file.force_zeros_for_empty_prompt == (arch_name == "tiny_sdxl")
    _same_weights(from_dir, ref)
    _same_weights(from_file, ref)
    req = ImageRequest("the cat", width=32, height=32, steps=2, seed=3)
    (a,), _, _ = ImagePipeline(from_dir).generate_tensors([req])
    (b,), _, _ = ImagePipeline(from_file).generate_tensors([req])
    # Same weights, same code. Not bit-identical everywhere: where BLAS picks its kernel by a
    # buffer's alignment (MKL on an AVX2-only EPYC) the two loads' sums run in another order, 1.3e-6
    # apart on this [0, 1] image; 1e-5 is ~80 float32 ulps of 1.0, far below a wrong weight's error.
    torch.testing.assert_close(a, b, rtol=0.0, atol=1e-5)


def test_fp16_single_file_is_cast_to_the_requested_dtype(written, tmp_path):
    arch_name, directory, _, ref = written
    modules = {name: getattr(ref, name) for name in MODULES if getattr(ref, name, None) is not None}
    write_single_file(tmp_path / "half.safetensors", modules, arch_name, dtype=torch.float16)
    loaded = load_components(tmp_path / "half.safetensors", tokenizer_dir=directory, arch=get_arch(arch_name))
    weight = loaded.unet.conv_in.weight
    assert weight.dtype == torch.float32
    assert torch.equal(weight, ref.unet.conv_in.weight.half().float())


def test_fp16_variant_file_names(written, tmp_path, monkeypatch):
    """`variant="fp16"` downloads leave only *.fp16.safetensors; the loader finds them, and builds the
    UNet and VAE itself (on meta, no random init), not through diffusers' from_pretrained."""
    import diffusers

    arch_name, _, _, ref = written
    for cls in (diffusers.UNet2DConditionModel, diffusers.AutoencoderKL):
        monkeypatch.setattr(cls, "from_pretrained", None)
    ref.save_pretrained(tmp_path / "variant", variant="fp16")
    assert (tmp_path / "variant" / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    assert not (tmp_path / "variant" / "unet" / "diffusion_pytorch_model.safetensors").exists()
    _same_weights(load_components(tmp_path / "variant"), ref)


def test_missing_parts_name_the_path(written, tmp_path, monkeypatch):
    arch_name, directory, single, _ = written
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    shutil.rmtree(broken / "tokenizer")
    with pytest.raises(ValueError, match=f"tokenizer directory '{broken / 'tokenizer'}' is missing"):
        load_components(broken)
    shutil.copytree(directory / "tokenizer", broken / "tokenizer")
    (broken / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(ValueError, match=f"no weights in '{broken / 'vae'}'"):
        load_components(broken)
    (broken / "model_index.json").unlink()
    with pytest.raises(ValueError, match="must be a diffusers checkpoint with model_index.json"):
        load_components(broken)
    with pytest.raises(ValueError, match="no such file or directory"):
        load_components(tmp_path / "absent.safetensors")
    monkeypatch.setattr(loader, "find_open_clip_bpe", lambda: None)  # as where open_clip is not installed
    with pytest.raises(ValueError, match="carries no tokenizer.*--tokenizer DIR.*open-clip-torch"):
        load_components(single, arch=get_arch(arch_name))


def test_single_file_without_tokenizer_dir_uses_open_clips_bpe(written, tmp_path, monkeypatch):
    arch_name, _, single, _ = written
    bpe = tmp_path / "bpe_simple_vocab_16e6.txt.gz"
    with gzip.open(bpe, "wt", encoding="utf-8") as f:
        f.write('"bpe_simple_vocab_16e6.txt#version: 0.2\nt h\nth e</w>\n')
    monkeypatch.setattr(loader, "find_open_clip_bpe", lambda: bpe)
    monkeypatch.setenv("TACIT_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load_components(single, arch=get_arch(arch_name))
    assert loaded.tokenizer.convert_tokens_to_ids("the</w>") == 513  # CLIP's layout: 512 byte symbols, then merges
    assert (loaded.tokenizer_2 is not None) == (arch_name == "tiny_sdxl")
    assert (tmp_path / "cache" / "clip-tokenizers").is_dir()


def test_sdxl_without_tokenizer_2(tmp_path):
    directory = tmp_path / "m"
    ref = write_diffusers_dir(directory, "tiny_sdxl")
    modules = {name: getattr(ref, name) for name in MODULES}
    write_single_file(tmp_path / "m.safetensors", modules, "tiny_sdxl")
    shutil.rmtree(directory / "tokenizer_2")
    expected = f"tokenizer directory '{directory / 'tokenizer_2'}' is missing"
    with pytest.raises(ValueError, match=expected):
        load_components(directory)
    with pytest.raises(ValueError, match=expected):
        load_components(tmp_path / "m.safetensors", tokenizer_dir=directory, arch=get_arch("tiny_sdxl"))


def test_corrupt_and_foreign_files(written, tmp_path):
    arch_name, directory, single, _ = written
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(single.read_bytes()[: single.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a readable .safetensors file"):
        load_components(truncated, tokenizer_dir=directory)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a readable .safetensors file"):
        load_components(garbage, tokenizer_dir=directory)
    foreign = tmp_path / "llm.safetensors"
    save_file({"model.embed_tokens.weight": torch.zeros(4, 4)}, str(foreign))
    with pytest.raises(ValueError, match="not an SDXL or SD 1.5 single-file checkpoint"):
        load_components(foreign, tokenizer_dir=directory)
    refiner = tmp_path / "refiner.safetensors"
    save_file({"conditioner.embedders.0.model.text_projection": torch.zeros(4, 4)}, str(refiner))
    with pytest.raises(ValueError, match="an SDXL refiner checkpoint"):
        load_components(refiner, tokenizer_dir=directory)
    with pytest.raises(ValueError, match="must be a .safetensors file"):
        load_components(directory / "model_index.json")
    # The tiny file against the published architecture (the default): strict loading names the misfit.
    with pytest.raises(ValueError, match="unet .*does not fit the architecture: .*of another shape"):
        load_components(single, tokenizer_dir=directory)
    # A corrupt shard inside a diffusers directory
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    weights = broken / "unet" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"cannot load '{broken / 'unet'}'"):
        load_components(broken)


def test_family_from_model_index(written):
    arch_name, directory, _, _ = written
    index = json.loads((directory / "model_index.json").read_text())
    assert index["_class_name"] == (
        "StableDiffusionXLPipeline" if arch_name == "tiny_sdxl" else "StableDiffusionPipeline"
    )
    pipe = ImagePipeline.from_pretrained(directory)
    assert pipe.model_name == "model"
    assert pipe.limits.size_multiple == 4 and pipe.limits.max_size == 128  # VAE factor 2 x one UNet downsample
    image = pipe.generate([ImageRequest("cat", width=16, height=24, steps=1, seed=0)])[0].images[0]
    assert image.size == (16, 24) and np.asarray(image).std() > 0


def test_sharded_weights_and_legacy_vae_names(tmp_path):
    """Large UNets ship as shards with an index; old VAE exports name attention query/key/value/proj_attn,
    which diffusers renames on load (tacit's meta-built fast path falls back to it for those)."""
    from safetensors.torch import load_file

    directory = tmp_path / "m"
    ref = write_diffusers_dir(directory, "tiny_sd15")
    shutil.rmtree(directory / "unet")
    ref.unet.save_pretrained(directory / "unet", max_shard_size="100KB")
    assert (directory / "unet" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    vae_file = directory / "vae" / "diffusion_pytorch_model.safetensors"
    legacy = {}
    for key, value in load_file(str(vae_file)).items():
        for new, old in [("to_q", "query"), ("to_k", "key"), ("to_v", "value"), ("to_out.0", "proj_attn")]:
            key = key.replace(f"attentions.0.{new}.", f"attentions.0.{old}.")
        legacy[key] = value
    assert any(".query." in k for k in legacy)
    save_file(legacy, str(vae_file))
    _same_weights(load_components(directory), ref)


def test_sdxl_refiner_is_refused_by_name(tmp_path):
    directory = tmp_path / "refiner"
    write_diffusers_dir(directory, "tiny_sdxl")
    index = json.loads((directory / "model_index.json").read_text())
    index["text_encoder"] = [None, None]
    (directory / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="an SDXL refiner"):
        load_components(directory)


def test_fp16_model_keeps_the_vae_in_fp32(written):
    """SDXL's VAE overflows in fp16 (force_upcast): the UNet and encoders take fp16, the VAE stays fp32."""
    arch_name, directory, single, _ = written
    for components in (
        load_components(directory, dtype=torch.float16),
        load_components(single, dtype=torch.float16, tokenizer_dir=directory, arch=get_arch(arch_name)),
    ):
        assert components.unet.dtype == components.text_encoder.dtype == torch.float16
        assert components.vae.dtype == torch.float32
        req = ImageRequest("the cat", width=16, height=16, steps=1, seed=0)
        (images,), _, _ = ImagePipeline(components).generate_tensors([req])
        assert images.dtype == torch.float32 and torch.isfinite(images).all()
