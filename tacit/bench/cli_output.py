"""What every `tacit bench` command prints and writes: aligned tables on stdout, progress on
stderr (so a table piped to a file stays clean), and the --json file."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def table(rows: list[dict]) -> str:
    """Rows as aligned columns: every key any row has, "-" where a row lacks it (a peer has no
    comm_share: a llama.cpp row beside tacit's once ended the run in a KeyError)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r[k]) if k in r else "-" for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_json(args, payload: dict) -> None:
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2))
        log(f"wrote {args.json}")


def print_ratios(r: dict[str, float]) -> None:
    for k, v in r.items():
        print(f"  {k}: {v:.2f}x")
