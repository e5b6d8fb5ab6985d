"""`tacit models`: what this machine can serve without downloading (loader/local_models.py), as a
table or, with --json, one JSON list."""

from __future__ import annotations

import argparse
import json

from tacit.loader.local_models import LocalModel, local_models, searched_places


def format_size(n: int) -> str:
    """Binary units, as --kv-cache-memory reads them (config/sizes.py): 1536 -> 1.5 KiB."""
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def table(models: list[LocalModel]) -> str:
    rows = [("MODEL", "FORMAT", "SIZE", "WHERE")]
    rows += [
        (m.model, m.format, format_size(m.size_bytes), m.source + (f" ({m.note})" if m.note else "")) for m in models
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)), r[3]]) for r in rows)


def cmd_models(args: argparse.Namespace) -> int:
    models = local_models()
    if args.json:
        print(json.dumps([m.to_dict() for m in models], indent=2))
        return 0
    if not models:
        where = "; ".join(f"{k}: {v}" for k, v in searched_places().items())
        print(f"no model found ({where}); `tacit fetch` fetches the default one")
        return 0
    print(table(models))
    return 0


def add_models_parser(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser(
        "models",
        help="list the models this machine can serve without downloading (the default, tacit's cache, the "
        "Hugging Face cache) and the name --model takes for each",
    )
    m.add_argument("--json", action="store_true", help="one JSON list: model, format, size_bytes, source, path, note")
    m.set_defaults(func=cmd_models)
