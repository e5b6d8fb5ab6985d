"""tacit's engine and the peers `tacit bench latency | throughput` compare it with, built from
the command line on the same weights and dtype, each peer in its own process; and the report of
the peers that crashed or hung."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from tacit.bench.cli_output import log
from tacit.bench.peers.process_peer import ProcessPeer
from tacit.engine.arg_utils import EngineArgs

PEERS = ["transformers", "llama.cpp"]
# Further peers by name -> 'module:Class' built with (model path, dtype); tests stand one in here.
PEER_FACTORIES: dict[str, str] = {}


def resident_bytes() -> int:
    """This process's resident set (Linux /proc; 0 elsewhere)."""
    import os

    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def check_peers(peers: list[str]) -> None:
    """Refuse an unknown --peer before anything is measured or loaded."""
    known = PEERS + ["transformers-cb"] + list(PEER_FACTORIES)
    unknown = [p for p in peers if p not in known]
    if unknown:
        raise ValueError(f"--peer {unknown[0]!r} is not a peer tacit knows; one of: {', '.join(known)}")


def setup_engines(args: argparse.Namespace, peers: list[str]) -> tuple[Any, list[Any], dict[str, float]]:
    """tacit's engine plus the peers, all on the same weights and dtype. A GGUF that tacit keeps
    in its GGML blocks (--quantization) goes to llama.cpp as it is, so both read the quantized
    bytes; transformers still gets it dequantized (it would dequantize inside every matmul)."""
    from dataclasses import replace

    import torch

    from tacit.bench.peers.tacit_engine import TacitBench
    from tacit.bench.random_model import resolve_bench_model
    from tacit.engine.llm_engine import LLMEngine

    engine_args = EngineArgs.from_cli_args(args)
    # --dtype auto stays auto: the platform's fast dtype (bf16 with oneDNN's bf16 matmul, else float32)
    engine_args = replace(engine_args, model=resolve_bench_model(engine_args.model))
    t0 = time.perf_counter()
    engine = LLMEngine(engine_args=engine_args)
    # Before any peer loads: tacit's own load time and the memory it holds.
    load = {"load_s": time.perf_counter() - t0, "rss_after_load_mb": resident_bytes() / 1e6}
    path, dtype = engine.source.path, engine.config.model.dtype
    engines = [TacitBench(engine)]
    for peer in peers:
        log(f"loading peer {peer} ...")
        if peer in ("transformers", "transformers-cb"):
            cls = "TransformersBench" if peer == "transformers" else "TransformersContinuousBench"
            factory, peer_args = (
                f"tacit.bench.peers.transformers_peer:{cls}",
                (path, dtype, getattr(args, "static_batch", 16)),
            )
        elif peer == "llama.cpp":
            from tacit.layers.ggml_linear_method import GGMLLinearMethod
            from tacit.layers.moe import FusedMoE

            # GGML blocks in a linear layer or an expert stack: llama.cpp reads the GGUF as it is.
            native = any(
                isinstance(getattr(m, "linear_method", None), GGMLLinearMethod)
                or (isinstance(m, FusedMoE) and m.w13_type is not None)
                for m in engine.model.modules()
            )
            if native and not path.is_file():
                raise ValueError(
                    f"--peer llama.cpp: {path} is a quantized Hugging Face checkpoint (FP8 / GPTQ / AWQ), which "
                    "llama.cpp cannot read and tacit does not export; compare with --peer llama.cpp on a GGUF of "
                    "the same model (e.g. Q8_0), or drop the peer"
                )
            gguf = path if native else gguf_for_llamacpp(path, dtype)
            factory, peer_args = "tacit.bench.peers.llamacpp_peer:LlamaCppBench", (gguf, engine.max_model_len)
        else:
            factory, peer_args = PEER_FACTORIES[peer], (path, dtype)
        # Each peer in its own process: one that crashes or hangs loses only its own rows.
        engines.append(ProcessPeer(peer, factory, peer_args, args.peer_timeout))
    torch.manual_seed(0)
    return engine, engines, load


def gguf_for_llamacpp(path: Path, dtype) -> Path:
    """The weights tacit runs, as a GGUF in tacit's dtype (a Q4_1 source would read 4x fewer bytes)."""
    import torch

    from tacit.loader.gguf_writer import export_hf_to_gguf, reencode_gguf
    from tacit.paths import cache_dir

    bf16 = dtype == torch.bfloat16
    out = cache_dir() / f"{path.stem if path.is_file() else path.name}.{'bf16' if bf16 else 'f32'}.gguf"
    if not out.exists():
        log(f"writing {out} for llama.cpp ...")
        tmp = out.with_suffix(".partial")
        (reencode_gguf(path, tmp, bf16) if path.is_file() else export_hf_to_gguf(path, tmp, bf16)).rename(out)
    return out


def report_failed_peers(engines: list) -> dict[str, dict[str, str]]:
    """Print each peer that crashed or hung (its rows are missing); {'failed_peers': {name: why}}."""
    failed = {e.name: e.failure for e in engines if getattr(e, "failure", None)}
    for name, why in failed.items():
        print(f"peer {name} failed: {why}; its results are missing, the others stand")
        if name == "llama.cpp" and "SIGSEGV" in why:
            print(
                "  llama-cpp-python's native build crashes on some CPUs that advertise AMX: docs/performance/bench.md "
                "says how to rebuild it without AMX"
            )
    for e in engines:
        close = getattr(e, "close", None)
        if close is not None:
            close()
    return {"failed_peers": failed} if failed else {}
