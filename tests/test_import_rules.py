"""The seams hold: kernels know tensors (not models or the engine), models know no scheduler,
layers know no engine. Checked on every import statement, function-local ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TACIT = Path(__file__).resolve().parent.parent / "tacit"
RULES = [
    ("kernels", ("tacit.models", "tacit.engine", "tacit.layers", "tacit.scheduling")),
    ("models", ("tacit.scheduling", "tacit.engine")),
    ("layers", ("tacit.engine",)),
]


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


@pytest.mark.parametrize("package, forbidden", RULES)
def test_package_does_not_import(package, forbidden):
    bad = [f"{p.relative_to(TACIT.parent)} imports {m}" for p in sorted((TACIT / package).rglob("*.py"))
           for m in imported_modules(p) if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert not bad, "; ".join(bad)
