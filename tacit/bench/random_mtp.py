"""A random DeepSeek-V3 (or V3.2) checkpoint gains an MTP layer, written as DeepSeek's checkpoints hold it:
`model.layers.{num_hidden_layers}.` with the decoder layer's tensors (named as transformers
saves a decoder layer), enorm, hnorm, eh_proj, shared_head.norm, and the copies of the embedding
and head a real checkpoint carries. Returns transformers' MtpModel holding the same weights, the
oracle tacit's MTP layer is tested against."""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path


def write_mtp_layer(main_model, path: Path, seed: int = 1, std: float = 0.15):
    """main_model: the transformers DeepseekV3ForCausalLM saved at path (its config says
    num_nextn_predict_layers=1, transformers' default). Writes path/model-mtp.safetensors (listed
    in the index when the checkpoint is sharded) and returns the MtpModel."""
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers.modeling_layers import MtpModel

    n = main_model.config.num_hidden_layers
    dtype = next(main_model.parameters()).dtype
    cfg = copy.deepcopy(main_model.config)
    cfg.num_hidden_layers = n + 1  # its layer n is the MTP layer's decoder layer, saved under its names
    if getattr(cfg, "mlp_layer_types", None) is not None:
        # DeepSeek-V3.2's config lists each layer's kinds: the MTP layer is a MoE layer with its
        # indexer, and MtpModel asks for its own lists (it restarts layer indexes at 0).
        cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["sparse"]
        cfg.layer_types = list(cfg.layer_types) + [cfg.layer_types[-1]]
        main_model.config.num_mtp_layers = 1
        main_model.config.mtp_layer_types = [cfg.layer_types[-1]]
        main_model.config.mtp_mlp_layer_types = ["sparse"]
        config_json = path / "config.json"
        doc = json.loads(config_json.read_text())
        doc.setdefault("num_nextn_predict_layers", 1)  # V3.2's checkpoints say 1; its transformers config has no field
        config_json.write_text(json.dumps(doc, indent=2))
    torch.manual_seed(seed)
    longer = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    mtp = MtpModel(main_model, 1).to(dtype)
    layer = mtp.layers[0]
    layer.mtp_block.load_state_dict(longer.model.layers[n].state_dict())
    with torch.no_grad():
        for norm in (layer.enorm, layer.hnorm, layer.post_norm):
            norm.weight.copy_(1.0 + 0.1 * torch.randn_like(norm.weight))
        layer.eh_proj.weight.normal_(0.0, std)
    prefix = f"model.layers.{n}."
    tensors = {}
    with tempfile.TemporaryDirectory() as tmp:
        longer.save_pretrained(tmp)
        for f in sorted(Path(tmp).glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                for name in h.keys():
                    if name.startswith(prefix):
                        tensors[name] = h.get_tensor(name)
    tensors.update(
        {
            prefix + "enorm.weight": layer.enorm.weight,
            prefix + "hnorm.weight": layer.hnorm.weight,
            prefix + "eh_proj.weight": layer.eh_proj.weight,
            prefix + "shared_head.norm.weight": layer.post_norm.weight,
            prefix + "shared_head.head.weight": main_model.lm_head.weight,
            prefix + "embed_tokens.weight": main_model.model.embed_tokens.weight,
        }
    )
    shard = "model-mtp.safetensors"
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path / shard), metadata={"format": "pt"})
    index = path / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"].update({name: shard for name in tensors})
        index.write_text(json.dumps(doc, indent=2))
    return mtp.eval()
