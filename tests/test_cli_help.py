"""`--help=GROUP | listgroup | KEYWORD`, vLLM's filtered help, on tacit's subcommands: the engine
flags are grouped by recipe section, `tacit serve`'s own by frontend."""

from __future__ import annotations

import pytest

from tacit.cli import build_parser, parse_args
from tacit.config.knobs import RECIPE_SECTIONS


def _help(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), list(argv))
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def test_listgroup_names_every_group_of_serve(capsys):
    code, out, _ = _help(capsys, "serve", "--help=listgroup")
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert listed == ["options", *RECIPE_SECTIONS, "frontend", "image"]
    assert "KV cache" in out  # each group says what it holds


def test_a_group_shows_its_flags_only_and_takes_vllms_config_spelling(capsys):
    code, out, _ = _help(capsys, "serve", "--help=cache")
    assert code == 0
    assert "--block-size" in out and "--kv-cache-dtype" in out
    assert "--host" not in out and "--max-num-seqs" not in out and "--model " not in out
    assert _help(capsys, "serve", "--help=CacheConfig")[1] == out  # vLLM's group title
    assert _help(capsys, "serve", "--help=CACHE")[1] == out  # any case


def test_frontend_holds_the_servers_own_flags(capsys):
    _, out, _ = _help(capsys, "serve", "--help=frontend")
    for flag in ("--host", "--api-key", "--enable-log-requests", "--log-format", "--enable-tokenizer-info-endpoint"):
        assert flag in out
    assert "--block-size" not in out


def test_a_keyword_finds_flags_by_name_or_help(capsys):
    code, out, _ = _help(capsys, "serve", "--help=prefix")
    assert code == 0
    assert "--no-enable-prefix-caching" in out  # by name
    assert "--port" not in out and "--dtype" not in out
    _, by_help, _ = _help(capsys, "serve", "--help=bearer")
    assert "--api-key" in by_help and "--host" not in by_help  # "bearer" is only in --api-key's help


def test_an_unknown_group_or_keyword_exits_2_listing_the_groups(capsys):
    code, out, err = _help(capsys, "serve", "--help=zzqx")
    assert code == 2 and out == ""
    assert "--help=zzqx" in err and "options, model, platform, parallel, cache, scheduler, frontend" in err
    assert "listgroup" in err


def test_plain_help_is_the_whole_page_grouped(capsys):
    code, out, _ = _help(capsys, "serve", "--help")
    assert code == 0 and out.startswith("usage: tacit serve")
    for title in (*RECIPE_SECTIONS, "frontend"):
        assert f"\n{title}:\n" in out
    assert _help(capsys, "serve", "-h")[1] == out


@pytest.mark.parametrize("command", [["generate"], ["chat"], ["bench", "latency"], ["profile"], ["eval", "kld"]])
def test_every_engine_command_takes_a_group(command, capsys):
    code, out, _ = _help(capsys, *command, "--help=scheduler")
    assert code == 0 and "--max-num-seqs" in out and "--block-size" not in out


def test_help_with_a_subcommands_name_shows_that_subcommand(capsys):
    code, out, _ = _help(capsys, "bench", "--help", "latency")
    assert code == 0 and out.startswith("usage: tacit bench latency")


def test_the_new_serve_flags_parse():
    args = parse_args(build_parser(), ["serve", "--enable-log-requests", "--log-format", "json"])
    assert args.enable_log_requests and args.log_format == "json" and not args.enable_tokenizer_info_endpoint
    default = parse_args(build_parser(), ["serve"])
    assert not default.enable_log_requests and default.log_format == "text"


def test_a_bad_log_format_is_refused_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(build_parser(), ["serve", "--log-format", "xml"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--log-format" in err and "'text'" in err and "'json'" in err
