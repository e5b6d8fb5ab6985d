"""Start `tacit serve`, send it one prompt of --megabytes MB (far past any context), poll /health
meanwhile, and print how long the refusal took, the slowest /health, and the server's RSS before
and after (tacit/bench/oversized.py does the measuring).

    python scripts/oversized_prompt_check.py [--megabytes 12] [-- serve flags, e.g. --model M]
"""

from __future__ import annotations

import argparse
import json

from tacit.bench.launch import TacitServer
from tacit.bench.oversized import oversized_prompt_check


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megabytes", type=float, default=12.0)
    ap.add_argument("serve_args", nargs="*", help="flags for tacit serve (after --)")
    args = ap.parse_args()
    with TacitServer(args.serve_args) as server:
        print(json.dumps(oversized_prompt_check(server.url, server.proc.pid, args.megabytes), indent=2))


if __name__ == "__main__":
    main()
