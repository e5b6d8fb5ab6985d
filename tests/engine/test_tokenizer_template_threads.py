"""--tokenizer, --chat-template and --threads do what they say: a checkpoint without tokenizer files
serves with another directory's (tensor-parallel workers open it too), a template file or text
replaces the checkpoint's, and torch's threads are the number given; bad ones are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tacit import LLM, SamplingParams
from tacit.cli import build_parser, parse_args
from tacit.config.engine_args import EngineArgs
from tacit.loader import open_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)


def _split_tokenizer(source: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the checkpoint without its tokenizer files, and a directory holding them."""
    model, tok_dir = tmp_path / "model", tmp_path / "tok"
    shutil.copytree(source, model)
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.move(model / name, tok_dir / name)
    return model, tok_dir


def test_tokenizer_chat_template_and_threads_reach_the_engine(tiny_llama, tmp_path):
    source = tiny_llama[2]
    model, tok_dir = _split_tokenizer(source, tmp_path)
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        open_model(model)  # the checkpoint alone has no tokenizer now
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    before = torch.get_num_threads()
    threads = 1 if before != 1 else 2
    argv = ["serve", "--model", str(model), "--dtype", "float32", "--tokenizer", str(tok_dir)]
    argv += ["--chat-template", str(template), "--threads", str(threads)]
    try:
        llm = LLM(engine_args=EngineArgs.from_cli_args(parse_args(build_parser(), argv)))
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    tok = llm.get_tokenizer()
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"
    assert tok.encode("hello world") == open_model(source).tokenizer.encode("hello world")
    ref = LLM(str(source), dtype="float32").generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids
    assert llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids == ref


def test_bad_tokenizer_and_chat_template_are_refused_naming_them(tiny_llama, tmp_path):
    source = tiny_llama[2]
    with pytest.raises(FileNotFoundError, match="tokenizer='/nowhere' is not a directory"):
        open_model(source, tokenizer="/nowhere")
    with pytest.raises(FileNotFoundError, match="chat_template='missing.jinja' is not a file"):
        open_model(source, chat_template="missing.jinja")
    with pytest.raises(ValueError, match="the chat template does not parse"):
        open_model(source, chat_template="{% for m in messages %}")
    # The template itself, as vLLM's --chat-template also takes it.
    tok = open_model(source, chat_template="{{ messages[0].content }}!").tokenizer
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "hi!"
    small = tmp_path / "small"
    shutil.copytree(source, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 8}))
    with pytest.raises(ValueError, match="tokens but the model embeds 8"):
        open_model(small, tokenizer=str(source))


def test_tensor_parallel_workers_open_the_other_tokenizer(tiny_llama, tmp_path):
    """A checkpoint without tokenizer files serves with --tokenizer under tensor parallelism too:
    each worker opens the model as the driver did (config.model.tokenizer), taking --threads."""
    source = tiny_llama[2]
    model, tok_dir = _split_tokenizer(source, tmp_path)
    ref = LLM(str(source), dtype="float32").generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids
    before = torch.get_num_threads()
    llm = LLM(str(model), dtype="float32", tokenizer=str(tok_dir), tensor_parallel_size=2, threads=1)
    try:
        assert torch.get_num_threads() == 1  # the driver's rank; each worker sets its own the same way
        assert llm.generate([[5, 6, 7]], GREEDY)[0].outputs[0].token_ids == ref
    finally:
        llm.shutdown()
        torch.set_num_threads(before)
