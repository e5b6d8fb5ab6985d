"""Start `tacit serve`, run four clients against it for --minutes (mixed lengths, streams,
structured output), and print its RSS over time and the drift of its idle RSS from the RSS after
the first minute (tacit/bench/soak.py does the measuring).

    python scripts/soak.py [--minutes 8] [--clients 4] [-- serve flags, e.g. --model M]
"""

from __future__ import annotations

import argparse
import json

from tacit.bench.launch import TacitServer
from tacit.bench.soak import soak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("serve_args", nargs="*", help="flags for tacit serve (after --)")
    args = ap.parse_args()
    with TacitServer(args.serve_args) as server:
        result = soak(server.url, server.proc.pid, args.minutes, args.clients)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
