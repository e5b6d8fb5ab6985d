"""gpt-oss's HF MXFP4 experts re-packed into ggml MXFP4 blocks (loader/mxfp4_checkpoint.py): the
blocks dequantize to exactly what transformers' own convert_moe_packed_tensors gives; the pair
streams through the HF loader as expert stacks; and the blocks round-trip through a GGUF file
unchanged (gguf_writer.add_ggml_blocks, then tacit's GGUF reader)."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tacit.kernels.ggml_quant import MXFP4, GGMLExpertStack
from tacit.loader.gguf_header import GGUFHeader
from tacit.loader.gguf_writer import add_ggml_blocks
from tacit.loader.mxfp4_checkpoint import (
    mxfp4_converted,
    mxfp4_expert_stack,
    mxfp4_ggml_blocks,
    mxfp4_weight_names,
    split_gate_up,
)
from tacit.loader.prequantized import converted_weights, quant_method, quantized_weight_names


def hf_pair(experts: int, rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random HF `_blocks` [E, N, K / 32, 16] (every code in both nibbles) and `_scales`
    [E, N, K / 32] over every exponent the format has, 0 (2^-127) to 255 (2^128: 6 * 2^128 is inf in
    both conventions alike)."""
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(0, 256, (experts, rows, cols // 32), dtype=torch.uint8, generator=g)
    scales.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)[: scales.numel()]
    return blocks, scales


def hf_dequantized(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """transformers' own: float32 [E, K, N] (the transpose of each expert's [N, K] matrix)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)


def dequantized(stack: GGMLExpertStack) -> torch.Tensor:
    return torch.stack([stack.dequantize_expert(e) for e in range(stack.shape[0])])


@pytest.mark.parametrize("experts, rows, cols", [(1, 1, 32), (3, 10, 96), (4, 64, 2880 // 9), (2, 90, 2880)])
def test_repacked_blocks_dequantize_to_transformers_values(experts, rows, cols):
    blocks, scales = hf_pair(experts, rows, cols, seed=rows + cols)
    stack = mxfp4_expert_stack(blocks, scales)
    assert stack.ggml_type == MXFP4 and stack.shape == (experts, rows, cols)
    assert stack.data.shape == (experts, rows, cols // 32 * 17)
    assert torch.equal(dequantized(stack), hf_dequantized(blocks, scales).transpose(1, 2))


def test_gate_up_split_is_gpt_oss_interleave():
    """GptOssExperts: gate = gate_up[..., ::2], up = gate_up[..., 1::2] of the [E, K, 2I] matrix."""
    blocks, scales = hf_pair(2, 12, 64, seed=3)
    want = hf_dequantized(blocks, scales)
    gate, up = split_gate_up(mxfp4_expert_stack(blocks, scales))
    assert gate.shape == up.shape == (2, 6, 64)
    assert torch.equal(dequantized(gate), want[..., ::2].transpose(1, 2))
    assert torch.equal(dequantized(up), want[..., 1::2].transpose(1, 2))


def test_stream_pairs_blocks_with_scales_and_passes_the_rest():
    gu, gu_s = hf_pair(2, 8, 64, seed=1)
    down, down_s = hf_pair(2, 64, 32, seed=2)
    bias = torch.zeros(2, 8)
    p = "model.layers.0.mlp.experts"
    stream = [
        (f"{p}.gate_up_proj_blocks", gu),
        (f"{p}.gate_up_proj_bias", bias),
        (f"{p}.down_proj_scales", down_s),
        (f"{p}.gate_up_proj_scales", gu_s),
        (f"{p}.down_proj_blocks", down),
    ]
    out = dict(mxfp4_converted(iter(stream)))
    assert list(out) == [
        f"{p}.gate_up_proj_bias",
        f"{p}.gate_proj.weight",
        f"{p}.up_proj.weight",
        f"{p}.down_proj.weight",
    ]
    assert out[f"{p}.gate_up_proj_bias"] is bias
    assert torch.equal(dequantized(out[f"{p}.down_proj.weight"]), hf_dequantized(down, down_s).transpose(1, 2))
    assert torch.equal(dequantized(out[f"{p}.up_proj.weight"]), hf_dequantized(gu, gu_s)[..., 1::2].transpose(1, 2))
    names = mxfp4_weight_names([n for n, _ in stream])
    assert names == {f"{p}.{proj}.weight": MXFP4 for proj in ("gate_proj", "up_proj", "down_proj")}
    with pytest.raises(ValueError, match=r"missing model.layers.0.mlp.experts.down_proj_scales"):
        list(mxfp4_converted(iter(stream[:1] + stream[3:])))


def test_bad_pairs_are_refused_by_name():
    blocks, scales = hf_pair(2, 4, 64, seed=0)
    with pytest.raises(ValueError, match=r"w_scales: one uint8 exponent per 32-value block, \[2, 4, 2\]"):
        mxfp4_ggml_blocks(blocks, scales[:, :, :1], "w")
    with pytest.raises(ValueError, match=r"w_blocks: uint8 \[..., N, K / 32, 16\]"):
        mxfp4_ggml_blocks(blocks.reshape(2, 4, 4, 8), scales, "w")
    with pytest.raises(ValueError, match="gate and up interleave"):
        split_gate_up(mxfp4_expert_stack(blocks[:, :3], scales[:, :3]))


def test_hf_checkpoint_with_mxfp4_config_streams_expert_stacks(tmp_path):
    """quantization_config quant_method mxfp4: the loader's prequantized path names the stacks
    from the headers and yields them re-packed as they stream."""
    gu, gu_s = hf_pair(4, 16, 64, seed=5)
    down, down_s = hf_pair(4, 64, 32, seed=6)
    p = "model.layers.0.mlp.experts"
    tensors = {
        f"{p}.gate_up_proj_blocks": gu,
        f"{p}.gate_up_proj_scales": gu_s,
        f"{p}.down_proj_blocks": down,
        f"{p}.down_proj_scales": down_s,
        "model.norm.weight": torch.ones(64),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert quant_method(tmp_path, config) == "mxfp4"
    names = quantized_weight_names([tmp_path / "model.safetensors"], "mxfp4")
    assert names == {f"{p}.gate_proj.weight": MXFP4, f"{p}.up_proj.weight": MXFP4, f"{p}.down_proj.weight": MXFP4}
    out = dict(converted_weights(iter(tensors.items()), "mxfp4", config))
    assert set(out) == set(names) | {"model.norm.weight"}
    assert torch.equal(dequantized(out[f"{p}.gate_proj.weight"]), hf_dequantized(gu, gu_s)[..., ::2].transpose(1, 2))


def test_repacked_blocks_round_trip_through_a_gguf_file(tmp_path):
    """The re-packed blocks written raw (llama.cpp's gpt-oss layout: ffn_gate_exps etc.) read back
    byte for byte by tacit's reader, and as the gguf package dequantizes them: the HF values."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    blocks, scales = hf_pair(3, 8, 96, seed=9)
    scales.clamp_(100, 150)  # finite values: the gguf package's numpy warns on inf
    gate, up = split_gate_up(mxfp4_expert_stack(blocks, scales))
    path = tmp_path / "experts.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    add_ggml_blocks(writer, "blk.0.ffn_gate_exps.weight", gate.data, MXFP4)
    add_ggml_blocks(writer, "blk.0.ffn_up_exps.weight", up.data, MXFP4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = GGUFHeader(path)
    want = hf_dequantized(blocks, scales)
    for info, stack, cols in zip(header.tensors, (gate, up), (slice(0, None, 2), slice(1, None, 2))):
        assert info.ggml_type == MXFP4 and info.shape == (3, 4, 96)
        raw = torch.from_numpy(np.array(header.data(info))).reshape(stack.data.shape)
        assert torch.equal(raw, stack.data)
        read = GGMLExpertStack(raw, info.ggml_type, info.shape)
        assert torch.equal(dequantized(read), want[..., cols].transpose(1, 2))
        numpy = gguf_dequantize(raw.numpy(), gguf.GGMLQuantizationType.MXFP4).reshape(info.shape)
        assert torch.equal(torch.from_numpy(numpy), want[..., cols].transpose(1, 2))
    with pytest.raises(ValueError, match="rows of 20 bytes are not whole MXFP4 blocks of 17"):
        add_ggml_blocks(writer, "x", torch.zeros(2, 20, dtype=torch.uint8), MXFP4)
