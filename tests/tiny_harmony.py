"""A tiny model that speaks gpt-oss's harmony format: the tiny tokenizer plus harmony's special
tokens, and a chat template that renders a conversation the way gpt-oss's does in what the
server relies on (reasoning_effort in the system turn, tools as a developer turn, earlier calls
as `to=functions.NAME ... <|call|>` after their analysis (`thinking`), tool results from `functions.NAME to=assistant`).

The model under it is the tiny gpt-oss (tiny_models.make_config("gpt_oss")): the server must
pick harmony with no flag, from its architecture GptOssForCausalLM / model_type gpt_oss
(harmony.speaks_harmony).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tiny_models import build_tokenizer, make_config

ARCH = "gpt_oss"
SERVER_FLAGS: dict[str, str] = {}

HARMONY_SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"]

HARMONY_TEMPLATE = """<|start|>system<|message|>Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}<|end|>
{%- if tools %}<|start|>developer<|message|># Tools
namespace functions {
{%- for t in tools %}
type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any;
{%- endfor %}
}<|end|>{% endif %}
{%- set ns = namespace(call='') %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}
{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif %}
{%- for c in m.tool_calls %}{% set ns.call = c.function.name %}<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary json<|message|>{{ c.function.arguments }}<|call|>{% endfor %}
{%- elif m.role == 'tool' %}<|start|>functions.{{ ns.call }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""


def harmony_tokenizer():
    """The tiny BPE tokenizer with the harmony markers added as special tokens (ids 384..390)."""
    tok = build_tokenizer()
    tok.add_special_tokens(HARMONY_SPECIAL)
    return tok


def build_harmony_model(path: Path, seed: int = 0) -> Path:
    """A tiny random checkpoint with the harmony tokenizer and template (its weights do not matter:
    the tests script its output, tests/scripted_output.py)."""
    import transformers as tf

    path.mkdir(parents=True, exist_ok=True)
    tok = harmony_tokenizer()
    cfg = make_config(ARCH, tok.get_vocab_size())
    torch.manual_seed(seed)
    tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": None,
                "eos_token": "<|return|>",  # gpt-oss's
                "chat_template": HARMONY_TEMPLATE,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return path
