"""The benchmark's plumbing (not its speed): workloads, SLO parsing, ratios, the CLI end to end."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tacit.bench.latency import active_weight_bytes, ratios, weight_bytes
from tacit.bench.serve import parse_slo
from tacit.bench.workloads import sample_lengths


def test_workloads_are_seeded_and_shaped():
    a = sample_lengths("longtail", 500, 100, 50, seed=3)
    assert a == sample_lengths("longtail", 500, 100, 50, seed=3)
    ins = sorted(i for i, _ in a)
    assert ins[len(ins) // 2] < 200 and ins[-1] > 400  # median near 100, a long tail
    assert sample_lengths("fixed", 3, 7, 5) == [(7, 5)] * 3
    assert all(i + o <= 64 for i, o in sample_lengths("longtail", 200, 100, 50, max_total=64))
    with pytest.raises(ValueError, match="valid: fixed, uniform, longtail"):
        sample_lengths("zipf", 3, 1, 1)


def test_weight_bytes_counts_a_lookup_table_only_when_a_head_streams_it():
    import torch

    model = torch.nn.ModuleDict({"embed": torch.nn.Embedding(100, 8), "head": torch.nn.Linear(8, 100, bias=False)})
    assert weight_bytes(model) == 800 * 4  # the head's matrix; the table is only looked up
    model["head"].weight = model["embed"].weight
    assert weight_bytes(model) == 800 * 4  # tied: one matrix, streamed by the head


def test_a_moe_decode_step_streams_only_the_experts_it_uses():
    import torch

    from tacit.kernels.moe_routing import MoERouting
    from tacit.layers.moe import FusedMoE

    experts = FusedMoE(num_experts=16, hidden_size=8, intermediate_size=4, routing=MoERouting(top_k=2))
    model = torch.nn.ModuleDict({"head": torch.nn.Linear(8, 100, bias=False), "moe": experts})
    stacks = 16 * 3 * 8 * 4 * 4  # w13 and w2, float32
    assert weight_bytes(model) == 800 * 4 + stacks
    assert active_weight_bytes(model, 1) == 800 * 4 + stacks * 2 // 16  # top-2 of 16
    # 8 tokens touch 16 * (1 - (14/16)^8) = 10.3 experts in expectation, never more than all 16
    assert active_weight_bytes(model, 8) == 800 * 4 + stacks - int(stacks * (14 / 16) ** 8)
    assert active_weight_bytes(model, 1000) <= weight_bytes(model)


def test_slo_parsing():
    assert parse_slo("ttft:500,tpot:50") == {"ttft": 0.5, "tpot": 0.05}
    with pytest.raises(ValueError, match="--slo part 'latency:5' is invalid"):
        parse_slo("latency:5")


def test_ratios_pair_by_pair():
    rows = [
        {"engine": "tacit", "batch_size": 1, "v": 30.0},
        {"engine": "peer", "batch_size": 1, "v": 10.0},
        {"engine": "peer", "batch_size": 4, "v": 10.0},
    ]
    assert ratios(rows, "v", "batch_size") == {"tacit/peer@batch_size=1": 3.0}


def test_bench_latency_cli_with_transformers_peer(tiny_llama, tmp_path):
    out = tmp_path / "lat.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tacit.cli",
            "bench",
            "latency",
            "--model",
            str(tiny_llama[2]),
            "--dtype",
            "float32",
            "--batch-sizes",
            "1,2",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--repeats",
            "1",
            "--peer",
            "transformers",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert {(row["engine"], row["batch_size"]) for row in data["rows"]} == {
        ("tacit", 1),
        ("tacit", 2),
        ("transformers", 1),
        ("transformers", 2),
    }
    assert set(data["ratios"]) == {"tacit/transformers@batch_size=1", "tacit/transformers@batch_size=2"}
    assert all(row["decode_tok_s"] > 0 for row in data["rows"])


def test_bench_throughput_cli(tiny_llama, tmp_path):
    out = tmp_path / "tp.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tacit.cli",
            "bench",
            "throughput",
            "--model",
            str(tiny_llama[2]),
            "--dtype",
            "float32",
            "--num-prompts",
            "12",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--peer",
            "transformers",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert [row["engine"] for row in data["rows"]] == ["tacit", "transformers"]
    assert "tacit/transformers" in data["ratios"]


def test_mixed_priority_workload_is_seeded_and_shaped():
    from tacit.bench.scenario import workload

    specs = workload(500, 64, 32, seed=2)
    assert [s.prompt for s in specs] == [s.prompt for s in workload(500, 64, 32, seed=2)]
    hi = [s for s in specs if s.interactive]
    assert 0.15 < len(hi) / len(specs) < 0.25
    assert {s.extra["priority"] for s in hi} == {0} and {s.extra["priority"] for s in specs if not s.interactive} == {1}
    assert all(s.slo["ttft"] < t.slo["ttft"] for s in hi[:5] for t in specs if not t.interactive)


def test_bench_serve_scenario_runs_every_policy(tiny_llama, tmp_path):
    from tacit.bench.scenario import workload

    out, png = tmp_path / "scenario.json", tmp_path / "scenario.png"
    # --plot only where matplotlib is installed (the bench extra): without it the command refuses --plot.
    plot_args = ["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tacit.cli",
            "bench",
            "serve",
            "--scenario",
            "mixed-priority",
            "--policies",
            "fcfs,sla",
            "--num-prompts",
            "10",
            "--idle-requests",
            "2",
            "--request-rate",
            "50",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--json",
            str(out),
            "--server-args",
            f"--model {tiny_llama[2]} --dtype float32",
            *plot_args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert [row["policy"] for row in data["rows"]] == ["fcfs", "sla"]
    assert all(row["done"] + row["failed"] == 10 for row in data["rows"])
    assert all(row["probe_bf16_TFLOPs"] > 0 and row["probe_read_GBps"] > 0 for row in data["rows"])
    hi = sum(s.interactive for s in workload(10, 8, 4, 0))
    assert all(len(row["hi_ttft_ms"]) == len(row["hi_tpot_ms"]) == hi for row in data["rows"])
    assert not plot_args or png.read_bytes()[:4] == b"\x89PNG"
    assert data["idle"]["idle_requests"] == 2 and "high-priority p99 TTFT" in r.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "tacit.cli",
            "bench",
            "serve",
            "--scenario",
            "mixed-priority",
            "--policies",
            "fcfs,lifo",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "lifo not known; valid: fcfs, priority, sjf, sla" in bad.stderr


def test_mixed_priority_plot_draws_ttft_and_tpot_per_policy(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from tacit.bench import plot, scenario
    from tacit.cli import build_parser

    args = build_parser().parse_args(["bench", "serve", "--scenario", "mixed-priority", "--plot", "s.png"])
    assert args.plot == "s.png" and args.scenario == "mixed-priority"
    rows = [
        {"policy": "fcfs", "hi_ttft_ms": [80.0, 900.0, None, 2400.0], "hi_tpot_ms": [210.0, 230.0, None, 250.0]},
        {"policy": "priority", "hi_ttft_ms": [60.0, 75.0, 90.0, 120.0], "hi_tpot_ms": [200.0, 220.0, 240.0, None]},
    ]
    drawn = []
    real = plot.plot_cdf_panels
    monkeypatch.setattr(plot, "plot_cdf_panels", lambda panels, *a: (drawn.append(panels), real(panels, *a)))
    path = tmp_path / "scenario.png"
    scenario.plot_distributions(rows, str(path), "mixed-priority")
    assert path.read_bytes()[:4] == b"\x89PNG"
    # Refused requests (None) are left out, each policy keeps its own values.
    assert drawn[0] == {
        "interactive TTFT (ms)": {"fcfs": [80.0, 900.0, 2400.0], "priority": [60.0, 75.0, 90.0, 120.0]},
        "interactive TPOT (ms)": {"fcfs": [210.0, 230.0, 250.0], "priority": [200.0, 220.0, 240.0]},
    }


def test_llama_cpp_peer_on_a_quantized_hf_checkpoint_is_refused(tiny_llama, tmp_path):
    from fp8_checkpoints import write_fp8_checkpoint

    path, _ = write_fp8_checkpoint(tiny_llama[2], tmp_path / "fp8")
    args = ["--model", str(path), "--dtype", "float32", "--quantization", "gguf", "--batch-sizes", "1"]
    args += ["--input-len", "4", "--output-len", "2", "--repeats", "1", "--peer", "llama.cpp"]
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "latency", *args], capture_output=True, text=True, timeout=300
    )
    assert r.returncode != 0 and "which llama.cpp cannot read and tacit does not export" in r.stderr, r.stderr


def test_table_shows_every_column_and_a_dash_where_a_peer_has_none():
    from tacit.bench.cli_output import table

    text = table([{"engine": "tacit", "tok_s": 2.0, "comm_share": 0.1}, {"engine": "llama.cpp", "tok_s": 1.5}])
    head, tacit, peer = text.splitlines()
    assert head.split() == ["engine", "tok_s", "comm_share"]
    assert tacit.split() == ["tacit", "2.000", "0.100"] and peer.split() == ["llama.cpp", "1.500", "-"]


def test_bare_bench_runs_the_latency_table_with_its_defaults(monkeypatch):
    """`tacit bench` with no subcommand runs `tacit bench latency` on the default model."""
    import tacit.bench.cli_engine as cli_engine
    from tacit.cli import main

    seen = []
    monkeypatch.setattr(cli_engine, "cmd_latency", lambda args: seen.append(args) or 0)
    assert main(["bench"]) == 0
    (args,) = seen
    assert (args.model, args.batch_sizes, args.input_len, args.output_len, args.peer) == (None, "1,4,16", 128, 64, [])
    seen.clear()
    assert main(["bench", "latency", "--batch-sizes", "1"]) == 0  # a subcommand still wins
    assert seen[0].batch_sizes == "1"


@pytest.mark.parametrize("scenario", ["multi-turn", "shared-prefix"])
def test_prefix_scenarios_run_with_the_cache_on_and_off(tiny_llama, tmp_path, scenario):
    """Cache on: the later turns (or a group's later requests) find the shared prefix; off:
    nothing is cached. Tiny sizes: 2 x 3 requests, a 64-token prefix, 4 tokens out; shared-prefix
    sends all six at once, so a 32-token step budget makes them queue behind the first prefills
    (in one step, none would have anything cached yet)."""
    out = tmp_path / "prefix.json"
    budget = " --max-num-batched-tokens 32" if scenario == "shared-prefix" else ""
    args = ["--groups", "2", "--group-size", "3", "--prefix-tokens", "64", "--suffix-tokens", "6"]
    args += ["--output-len", "4", "--rounds", "1", "--json", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "serve", "--scenario", scenario, *args]
        + ["--server-args", f"--model {tiny_llama[2]} --dtype float32{budget}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    on, off = json.loads(out.read_text())["rows"]
    assert (on["cache"], off["cache"]) == ("on", "off") and on["requests"] == off["requests"] == 6
    assert off["cached_tokens"] == 0 and on["cached_tokens"] >= 4 * 48  # 4 later requests, 3 of 4 blocks at least
    assert on["prompt_tokens"] == off["prompt_tokens"] and "later-request TTFT" in r.stdout


def test_restart_scenario_finds_the_prefixes_on_disk_only_with_the_tier(tiny_llama, tmp_path):
    """Two 64-token prefixes answered, the server restarted, two new questions on them: with the
    disk tier the prefixes' full blocks come back from its files; without it nothing is cached."""
    out = tmp_path / "restart.json"
    args = ["--groups", "2", "--prefix-tokens", "64", "--suffix-tokens", "6", "--output-len", "4"]
    args += ["--rounds", "1", "--tier-gib", "0.01", "--json", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "serve", "--scenario", "restart", *args]
        + ["--server-args", f"--model {tiny_llama[2]} --dtype float32"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    tier, plain = json.loads(out.read_text())["rows"]
    assert (tier["tier"], plain["tier"]) == ("disk tier", "no tier") and tier["requests"] == 4
    assert plain["after_cached_tokens"] == 0 and tier["after_cached_tokens"] >= 2 * 48  # 3 of 4+ blocks each
    assert "TTFT after a restart" in r.stdout


def test_multi_turn_against_llama_cpp_runs_its_server_as_the_issue_asks(tiny_llama, tmp_path):
    """--peer llama.cpp on a stand-in of llama-cpp-python's server (the real one is an optional
    extra): it is started on the same .gguf as tacit with its RAM prompt cache, gets the
    conversations one at a time, and its requests ban end-of-sequence with logit_bias (it has no
    ignore_eos)."""
    from tacit.bench.peer_multi_turn import gguf_of
    from tacit.loader.gguf_writer import export_hf_to_gguf

    with pytest.raises(ValueError, match="needs a .gguf model"):
        gguf_of(["--model", str(tiny_llama[2])])
    gguf = export_hf_to_gguf(tiny_llama[2], tmp_path / "tiny.gguf")
    log = tmp_path / "llama.jsonl"
    env = dict(os.environ, FAKE_LLAMA_CPP_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "fake_llama_cpp"), env.get("PYTHONPATH", "")])
    out = tmp_path / "peer.json"
    args = ["--groups", "2", "--group-size", "2", "--prefix-tokens", "64", "--suffix-tokens", "6"]
    args += ["--output-len", "3", "--rounds", "1", "--json", str(out), "--peer", "llama.cpp"]
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "serve", "--scenario", "multi-turn", *args]
        + ["--server-args", f"--model {gguf} --dtype float32"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    tacit, peer = json.loads(out.read_text())["rows"]
    assert (tacit["engine"], peer["engine"]) == ("tacit", "llama.cpp") and tacit["requests"] == peer["requests"] == 4
    assert tacit["cached_tokens"] > 0  # tacit's later turns hit its prefix cache
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    argv = seen[0]["argv"]
    assert argv[argv.index("--model") + 1] == str(gguf)
    assert argv[argv.index("--cache") + 1] == "true" and argv[argv.index("--cache_type") + 1] == "ram"
    bodies = [e["body"] for e in seen[1:]]
    assert len(bodies) == 4 and all(b["logit_bias"] for b in bodies)
    # One conversation at a time: the first conversation's two turns come before the second's.
    systems = [b["messages"][0]["content"] for b in bodies]
    assert [len(b["messages"]) for b in bodies] == [2, 4, 2, 4] and len(set(systems)) == 1
    assert "lower with tacit" in r.stdout


def test_bench_spec_compares_speculation_on_and_off_on_the_same_tokens(tiny_llama, tmp_path):
    """`tacit bench spec` on the tiny checkpoint (float32, so every path computes alike): each
    case alternates off and on, compares their tokens, and prints the ratio of the pairs."""
    out = tmp_path / "spec.json"
    # The tiny tokenizer spells the shipped workload's files in more tokens than it has positions:
    # a workload of its own, in the same form.
    code = "def add(a, b):\n    return a + b\n\n" * 6
    rows = [{"kind": "repetitive", "messages": [{"role": "user", "content": f"Repeat this file:\n{code}"}]}]
    rows += [{"kind": "chat", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(3)]
    workload = tmp_path / "spec.jsonl"
    workload.write_text("".join(json.dumps(x) + "\n" for x in rows))
    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "spec", "--model", str(tiny_llama[2]), "--dtype", "float32"]
        + ["--workload", str(workload), "--cases", "repetitive:1,mixed:3", "--output-len", "12", "--repeats", "2"]
        + ["--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    rows = got["rows"]
    assert [(x["workload"], x["batch_size"], x["engine"]) for x in rows[:4]] == [
        ("repetitive", 1, "tacit off"),
        ("repetitive", 1, "tacit on"),
        ("repetitive", 1, "tacit off"),
        ("repetitive", 1, "tacit on"),
    ]
    assert all(x["identical"] for x in rows if x["engine"] == "tacit on")
    assert got["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert "repetitive batch 1: speculation" in r.stdout and "output identical" in r.stdout
    from tacit.bench.spec_decode import medians  # --plot's bars: a median per case and engine

    bars = medians(rows)
    assert list(bars) == ["repetitive batch 1", "mixed batch 3"]
    assert all(set(v) == {"tacit off", "tacit on"} and min(v.values()) > 0 for v in bars.values())
    bad = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "bench", "spec", "--cases", "poetry:1"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "--cases 'poetry:1' is invalid" in bad.stderr


def test_the_shipped_spec_workload_loads_and_a_bad_one_is_refused(tiny_llama, tmp_path):
    from tacit.bench.spec_decode import WORKLOAD, load_prompts
    from tacit.loader import open_model

    tok = open_model(str(tiny_llama[2])).tokenizer
    prompts = load_prompts(tok, WORKLOAD)
    assert (len(prompts["repetitive"]), len(prompts["chat"])) == (4, 8)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"kind": "poetry", "messages": []}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: needs kind repetitive or chat"):
        load_prompts(tok, bad)
    import copy

    plain = copy.copy(tok)  # a checkpoint without a chat template (random:NAME): texts, one a line
    plain.chat_template = None
    first = json.loads(WORKLOAD.read_text().splitlines()[0])["messages"]
    text = "\n".join(m["content"] for m in first) + "\n"
    assert load_prompts(plain, WORKLOAD)["repetitive"][0] == tok.encode(text)


def test_grouped_bars_are_drawn_one_cluster_per_case(tmp_path):
    pytest.importorskip("matplotlib")
    from tacit.bench.plot import plot_grouped_bars

    path = tmp_path / "spec.png"
    plot_grouped_bars({"chat batch 1": {"tacit off": 200.0, "tacit on": 210.0}}, "decode tok/s", str(path), "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
