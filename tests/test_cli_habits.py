"""The command line takes the spellings users bring from vLLM, SGLang and llama.cpp (each parses to
the same engine arguments as tacit's own flag), sizes with units, --version, and answers an unknown
flag with the subcommand's usage and the closest valid flags."""

from __future__ import annotations

import argparse

import pytest

import tacit
from tacit.cli import build_parser, parse_args
from tacit.config.engine_args import EngineArgs
from tacit.config.parallel import ParallelConfig
from tacit.config.sizes import parse_size


def _serve(*argv: str) -> argparse.Namespace:
    return parse_args(build_parser(), ["serve", *argv])


@pytest.mark.parametrize(
    "theirs, ours",
    [
        (["--enable-expert-parallel"], ["--expert-parallel"]),  # vLLM
        (["--enable-dp-attention"], ["--data-parallel-attention"]),  # SGLang
        (["--kv-cache-memory", "2GiB"], ["--kv-cache-memory", str(2 << 30)]),
        (["--kv-cache-memory", "512MiB"], ["--kv-cache-memory", str(512 << 20)]),
        (["--kv-cache-memory", "1.5GB"], ["--kv-cache-memory", str(3 << 29)]),  # binary, as every size flag
        (["--kv-cache-memory", "64k"], ["--kv-cache-memory", str(64 << 10)]),
        (["--expert-cache-memory", "3G"], ["--expert-cache-memory", str(3 << 30)]),
        (["--swap-space", "512MiB"], ["--swap-space", "0.5"]),
        (["--kv-offloading-size", "2GiB"], ["--kv-offloading-size", "2"]),
    ],
)
def test_their_spelling_parses_to_the_same_engine_args_as_ours(theirs, ours):
    got = EngineArgs.from_cli_args(_serve(*theirs))
    assert got == EngineArgs.from_cli_args(_serve(*ours))
    assert got != EngineArgs(), "the flag changed nothing"


def test_plain_byte_counts_still_work_and_sizes_keep_their_units():
    assert EngineArgs.from_cli_args(_serve("--kv-cache-memory", "1048576")).kv_cache_memory == 1 << 20
    assert parse_size("2GiB") == parse_size("2gb") == parse_size("2G") == 2 << 30
    assert parse_size("512MiB", 1 << 30) == 0.5


@pytest.mark.parametrize("bad", ["2GX", "lots", "1.5", "2 GiB GiB", ""])
def test_a_bad_size_is_refused_naming_the_flag_and_the_valid_forms(bad, capsys):
    with pytest.raises(SystemExit) as e:
        _serve("--kv-cache-memory", bad)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "argument --kv-cache-memory" in err and repr(bad) in err and "2GiB" in err and "512MiB" in err


def test_version_prints_tacits_version(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), ["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"tacit {tacit.__version__}"


@pytest.mark.parametrize(
    "argv, usage, suggestion",
    [
        (["serve", "--kv-cache-memroy", "2GiB"], "usage: tacit serve", "did you mean --kv-cache-memory"),
        (["serve", "--enable-expert-paralel"], "usage: tacit serve", "did you mean --enable-expert-parallel"),
        (["chat", "--max-tokns=5"], "usage: tacit chat", "did you mean --max-tokens"),
        (["bench", "latency", "--batch-sizez", "1,2"], "usage: tacit bench latency", "did you mean --batch-sizes"),
    ],
)
def test_an_unknown_flag_gets_the_subcommands_usage_and_the_closest_names(argv, usage, suggestion, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.startswith(usage), err
    assert f"unrecognized arguments: {argv[1 if argv[0] != 'bench' else 2]}" in err and suggestion in err


def test_an_unknown_flag_with_nothing_close_points_at_help(capsys):
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["serve", "--zzzzqqqq"])
    assert "--zzzzqqqq: see `tacit serve --help`" in capsys.readouterr().err


def test_tool_call_parser_takes_hermes_and_refuses_others_naming_it(capsys):
    args = _serve("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    assert args.tool_call_parser == "hermes" and args.enable_auto_tool_choice
    with pytest.raises(SystemExit):
        _serve("--tool-call-parser", "mistral")
    err = capsys.readouterr().err
    assert "argument --tool-call-parser" in err and "'mistral'" in err and "valid: hermes" in err


def test_served_model_name_names_the_model():
    pytest.importorskip("fastapi")
    from tacit.entrypoints.openai.api_server import served_model_name

    assert served_model_name(_serve("--served-model-name", "my-model"), "/models/x") == "my-model"
    assert served_model_name(_serve(), "/models/x") == "/models/x"


def test_new_model_flags_reach_engine_args():
    args = EngineArgs.from_cli_args(
        _serve("--threads", "3", "--tokenizer", "/tok", "--chat-template", "t.jinja", "--generation-config", "vllm")
    )
    assert (args.tokenizer, args.chat_template, args.generation_config) == ("/tok", "t.jinja", "vllm")
    assert args.create_parallel_config().threads == 3
    assert EngineArgs().generation_config == "auto"  # vLLM's default: the model's generation_config.json


@pytest.mark.parametrize("threads", [0, -2, 1.5, True])
def test_threads_must_be_a_positive_integer(threads):
    with pytest.raises(ValueError, match="threads="):
        ParallelConfig(threads=threads)
    with pytest.raises(ValueError, match="threads="):
        EngineArgs(threads=threads).check()
