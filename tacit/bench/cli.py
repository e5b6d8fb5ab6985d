"""`tacit bench hw | latency | attention | comm | throughput | spec | serve | workload | image`:
print a table, optionally write JSON. `tacit bench` alone runs `tacit bench latency` on the default model.

One module per family of benchmarks, each with its parsers and command functions:
cli_machine.py (hw, attention, comm), cli_engine.py (latency, throughput; the engine and peers
they compare are built by cli_peers.py), cli_serve.py (serve, workload) and cli_image.py (image:
a diffusion UNet and VAE); cli_output.py is the table and JSON output they share."""

from __future__ import annotations

import argparse

from tacit.bench.cli_engine import add_engine_parsers
from tacit.bench.cli_image import add_image_parser
from tacit.bench.cli_machine import add_machine_parsers
from tacit.bench.cli_serve import add_serve_parsers


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="measure this machine and tacit (see docs/benchmarks.md)")
    bsub = b.add_subparsers(dest="bench")
    add_machine_parsers(bsub)
    lat = add_engine_parsers(bsub)
    add_serve_parsers(bsub)
    add_image_parser(bsub)

    # `tacit bench` alone: the latency table on the default model, with latency's own defaults.
    def bare_bench(args: argparse.Namespace) -> int:
        latency_args = lat.parse_args([])
        return latency_args.func(latency_args)

    b.set_defaults(func=bare_bench)
