"""Layering rules between tacit's packages, checked on the source with `ast` (nothing is imported).

Every import of a tacit module counts: top-level, inside a function, and under
`if TYPE_CHECKING:` (a type-only import is still a dependency that a refactor must respect).
Relative imports are resolved against the importing module's package.
`from tacit.pkg import Name` also counts the module Name is re-exported from when
tacit/pkg/__init__.py binds it with a `from tacit.x import Name` (so `from tacit import LLM`
is an import of tacit.entrypoints.llm).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# layer (a package, matched with its submodules) -> forbidden prefixes, and why.
# fmt: off
RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("tacit.entrypoints", ("tacit.bench",),
     "the user-facing CLI/server must not ship the benchmark harness or its peers' dependencies"),
    ("tacit.bench", ("tacit.entrypoints",),
     "benchmarks drive the engine directly, so a CLI/server change cannot move a benchmark number"),
    ("tacit.kernels", ("tacit.models", "tacit.engine", "tacit.layers", "tacit.scheduling", "tacit.entrypoints"),
     "kernels are the bottom layer: pure compute on tensors and metadata, reusable by any model"),
    ("tacit.layers", ("tacit.scheduling", "tacit.engine", "tacit.entrypoints"),
     "layers are model building blocks and must not know about requests, the scheduler or the engine"),
    ("tacit.models", ("tacit.scheduling", "tacit.engine", "tacit.entrypoints"),
     "a model is a forward pass over tensors; scheduling and serving sit above it"),
    ("tacit.memory", ("tacit.engine", "tacit.entrypoints", "tacit.models"),
     "KV cache bookkeeping is model-agnostic and is driven by the engine, not the other way round"),
    ("tacit.scheduling", ("tacit.engine", "tacit.entrypoints", "tacit.models"),
     "the scheduler decides from request state and cost numbers, not from a model or the engine"),
    ("tacit.structured_output", ("tacit.engine", "tacit.entrypoints", "tacit.models", "tacit.scheduling",
                                 "tacit.layers", "tacit.bench"),
     "grammars and their matchers sit under the scheduler that owns them: tokens in, bitmasks out"),
    ("tacit.eval", ("tacit.bench",),
     "evaluations use the engine and the offline LLM, never the benchmark harness"),
    ("tacit.distributed", ("tacit.models", "tacit.engine", "tacit.layers", "tacit.scheduling", "tacit.entrypoints",
                           "tacit.bench", "tacit.memory"),
     "communication is a bottom layer like kernels: tensors between ranks, reusable by any model or engine"),
    ("tacit.engine", ("tacit.entrypoints", "tacit.bench", "tacit.eval"),
     "the engine is the library core; the CLI, server and benchmarks wrap it"),
    ("tacit.diffusion", ("tacit.engine", "tacit.entrypoints", "tacit.scheduling", "tacit.bench"),
     "the diffusion pipeline is model-level code (tensors in, images out); the image engine and server wrap it"),
]
# The profiler hooks into the engine from above: nothing it measures may depend on it.
RULES += [
    (layer, ("tacit.profiler",), "the profiler instruments the engine from above; what it times never imports it")
    for layer in ("tacit.kernels", "tacit.layers", "tacit.models", "tacit.worker", "tacit.engine", "tacit.distributed",
                  "tacit.memory", "tacit.scheduling", "tacit.entrypoints", "tacit.bench")
]
RULES.append(("tacit.profiler", ("tacit.entrypoints",), "the profiler drives the engine directly, as bench does"))
# fmt: on

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "tacit"


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. tacit.kernels.torch_attention; a package is named by its __init__
    path: str  # shown in messages
    source: str
    is_package: bool


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    importer: str
    imported: str
    layer: str
    forbidden: str
    why: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line} -> {self.imported}  [{self.layer} must not import {self.forbidden}: {self.why}]"
        )


def walk_package(package_dir: Path = PACKAGE_DIR) -> list[Module]:
    modules = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent)
        parts = list(rel.with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules.append(Module(".".join(parts), str(rel), path.read_text(encoding="utf-8"), is_package))
    return modules


def _resolve_relative(module: Module, level: int, target: str | None) -> str:
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{target}" if target else base


def _from_import_bindings(module: Module) -> dict[str, str]:
    """Names a package __init__ binds with `from tacit.x import Name` (absolute or relative): name -> module."""
    bindings: dict[str, str] = {}
    for node in ast.walk(ast.parse(module.source)):
        if isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, node.level, node.module) if node.level else (node.module or "")
            if _within(base, "tacit"):
                for alias in node.names:
                    bindings[alias.asname or alias.name] = base
    return bindings


def tacit_imports(module: Module, known: dict[str, Module]) -> list[tuple[int, str]]:
    """(line, imported tacit module) for every import anywhere in the module's source."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(module.source, filename=module.path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _within(alias.name, "tacit"):
                    found.append((node.lineno, alias.name))
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, node.level, node.module) if node.level else (node.module or "")
            if not _within(base, "tacit"):
                continue
            found.append((node.lineno, base))
            package = known.get(base)
            reexports = _from_import_bindings(package) if package is not None and package.is_package else {}
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:  # `from tacit.pkg import submodule`
                    found.append((node.lineno, sub))
                elif alias.name in reexports and reexports[alias.name] != base:  # re-exported by pkg/__init__
                    found.append((node.lineno, reexports[alias.name]))
    return sorted(set(found))


def check(modules: list[Module], rules=RULES) -> list[Violation]:
    known = {m.name: m for m in modules}
    violations = []
    for module in modules:
        layer_rules = [r for r in rules if _within(module.name, r[0])]
        if not layer_rules:
            continue
        for line, imported in tacit_imports(module, known):
            for layer, forbidden, why in layer_rules:
                for prefix in forbidden:
                    if _within(imported, prefix):
                        violations.append(Violation(module.path, line, module.name, imported, layer, prefix, why))
    return sorted(set(violations), key=lambda v: (v.path, v.line, v.imported))


def test_import_rules():
    violations = check(walk_package())
    assert not violations, f"{len(violations)} import-rule violation(s):\n" + "\n".join(map(str, violations))


def test_walker_finds_the_package():
    modules = walk_package()
    assert len(modules) > 50, [m.name for m in modules]
    names = {m.name for m in modules}
    for layer, _, _ in RULES:
        assert layer in names, f"rule for {layer} names a package that is not there"
    # and it sees imports: the engine imports the scheduler
    known = {m.name: m for m in modules}
    assert any(_within(imp, "tacit.scheduling") for _, imp in tacit_imports(known["tacit.engine.llm_engine"], known))


def _synthetic(name: str, source: str, is_package: bool = False) -> Module:
    return Module(name, name.replace(".", "/") + ("/__init__.py" if is_package else ".py"), source, is_package)


def test_checker_reports_a_broken_rule():
    """Negative control: a fake kernel that imports a model, in every form the walker must see."""
    source = """\
from __future__ import annotations
from typing import TYPE_CHECKING
import tacit.models.llama  # line 3: absolute import
from tacit.forward_context import AttentionMetadata  # allowed
if TYPE_CHECKING:
    from tacit.engine.llm_engine import LLMEngine  # line 6: type-only, still counted
def f():
    from ..layers import sampler  # line 8: relative, inside a function
    from tacit import LLM  # line 9: re-exported by tacit/__init__ from tacit.entrypoints.llm
    from . import torch_attention  # allowed: same layer
    import os  # not tacit
"""
    fake = _synthetic("tacit.kernels.fake", source)
    modules = [
        fake,
        _synthetic("tacit", "from tacit.entrypoints.llm import LLM\n", is_package=True),
        _synthetic("tacit.entrypoints.llm", "class LLM: ...\n"),
        _synthetic("tacit.layers", "", is_package=True),
        _synthetic("tacit.layers.sampler", ""),
        _synthetic("tacit.kernels", "", is_package=True),
        _synthetic("tacit.kernels.torch_attention", ""),
    ]
    found = {(v.line, v.imported, v.forbidden) for v in check(modules)}
    assert found == {
        (3, "tacit.models.llama", "tacit.models"),
        (6, "tacit.engine.llm_engine", "tacit.engine"),
        (8, "tacit.layers", "tacit.layers"),
        (8, "tacit.layers.sampler", "tacit.layers"),
        (9, "tacit.entrypoints.llm", "tacit.entrypoints"),
    }
    message = str(check(modules)[0])
    assert "tacit/kernels/fake.py:3 -> tacit.models.llama" in message and "tacit.kernels must not import" in message


def test_relative_imports_resolve_from_packages_and_modules():
    pkg = _synthetic("tacit.scheduling", "from .policy import X\nfrom ..engine import y\n", is_package=True)
    mod = _synthetic("tacit.scheduling.policy", "from .request import R\nfrom ..models.llama import L\n")
    known = {m.name: m for m in (pkg, mod)}
    assert tacit_imports(pkg, known) == [(1, "tacit.scheduling.policy"), (2, "tacit.engine")]
    assert tacit_imports(mod, known) == [(1, "tacit.scheduling.request"), (2, "tacit.models.llama")]
    assert {(v.line, v.imported) for v in check([pkg, mod])} == {(2, "tacit.engine"), (2, "tacit.models.llama")}


# Every module's tier, bottom to top: a module imports its own tier and those below, never one
# above (RULES above add the bans inside a tier). The public face (`tacit`, tacit/__init__.py)
# and the command line sit on top.
# fmt: off
TIERS: list[tuple[str, ...]] = [
    ("tacit.paths", "tacit.registry", "tacit.chat_content", "tacit.sampling_params", "tacit.pooling_params",
     "tacit.outputs",
     "tacit.model_config_checks", "tacit.plotting"),
    # kv_cache_interface: the KV cache specs backends declare (over kernels/kv_quant's layouts).
    ("tacit.kernels", "tacit.kv_cache_interface"),
    ("tacit.platforms", "tacit.distributed", "tacit.forward_context", "tacit.tokenizer"),
    ("tacit.config", "tacit.loader"),
    ("tacit.memory", "tacit.structured_output"),
    # EngineArgs sits above the rest of tacit.config: it checks names against the scheduling
    # policies' registry, and the policies import SchedulerConfig.
    ("tacit.layers", "tacit.scheduling", "tacit.config.engine_args"),
    # diffusion: model-level code like tacit.models (issue 39's contract: kernels, layers, platforms
    # and paths below it; the image engine, server and `tacit bench image` above).
    ("tacit.models", "tacit.diffusion"),
    ("tacit.worker",),
    ("tacit.engine",),
    # tune: searches engine configurations with the engine, the benchmarks and the performance model.
    ("tacit.entrypoints", "tacit.bench", "tacit.eval", "tacit.perf_model", "tacit.profiler", "tacit.tune"),
    ("tacit.cli", "tacit"),
]
# fmt: on
PUBLIC_FACE = "tacit"


def tier_of(module: str) -> int | None:
    """The tier of the longest prefix of `module` that TIERS names."""
    best: tuple[int, int] | None = None
    for i, prefixes in enumerate(TIERS):
        for p in prefixes:
            if _within(module, p) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def _module_of(name: str, known: dict[str, Module]) -> str:
    """`tacit.x.Name` -> the module tacit.x that defines it."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def import_graph(modules: list[Module]) -> dict[str, dict[str, int]]:
    """{module: {imported module: first line}} over every import anywhere in each module."""
    known = {m.name: m for m in modules}
    graph: dict[str, dict[str, int]] = {}
    for m in modules:
        edges = graph.setdefault(m.name, {})
        for line, imported in tacit_imports(m, known):
            target = _module_of(imported, known)
            if target != m.name:
                edges.setdefault(target, line)
    return graph


def upward_imports(modules: list[Module]) -> list[str]:
    known = {m.name: m for m in modules}
    graph = import_graph(modules)
    found = []
    for m in modules:
        mine = tier_of(m.name)
        if mine is None:
            found.append(f"{m.path}: in no tier of TIERS (place its package there)")
            continue
        for target, line in graph[m.name].items():
            theirs = tier_of(target)
            if target in known and theirs is not None and theirs > mine:
                found.append(f"{m.path}:{line} -> {target} (tier {mine} imports tier {theirs})")
    return found


def import_cycles(modules: list[Module], excepted: str = PUBLIC_FACE) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan, iteratively), the public
    face excepted: its names are bound lazily, on first use."""
    graph = {
        k: [t for t in v if t != excepted and t in {m.name for m in modules}]
        for k, v in import_graph(modules).items()
        if k != excepted
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, []))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    members.append(top)
                    if top == node:
                        break
                if len(members) > 1:
                    cycles.append(sorted(members))
    return cycles


def test_no_import_cycle_anywhere():
    cycles = import_cycles(walk_package())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_module_imports_from_a_tier_above_it():
    found = upward_imports(walk_package())
    assert not found, f"{len(found)} upward import(s):\n" + "\n".join(found)


def test_cycle_and_tier_checks_report_what_they_should():
    """Negative controls: a cycle hidden behind a function-level import, and a kernel importing
    the engine."""
    modules = [
        _synthetic("tacit.config", "from tacit.scheduling.policy import POLICIES\n"),
        _synthetic("tacit.scheduling.policy", "def f():\n    from tacit.config import SchedulerConfig\n"),
        _synthetic("tacit.kernels.fake", "from tacit.engine.llm_engine import LLMEngine\n"),
        _synthetic("tacit.engine.llm_engine", "class LLMEngine: ...\n"),
    ]
    assert import_cycles(modules) == [["tacit.config", "tacit.scheduling.policy"]]
    assert upward_imports(modules) == [
        "tacit/config.py:1 -> tacit.scheduling.policy (tier 3 imports tier 5)",
        "tacit/kernels/fake.py:1 -> tacit.engine.llm_engine (tier 1 imports tier 8)",
    ]


def eager_tacit_imports(module: Module) -> list[int]:
    """Lines of the tacit imports a module makes when it is imported: top-level ones, outside
    function bodies and `if TYPE_CHECKING:` blocks."""
    lines = []
    for stmt in ast.parse(module.source).body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(stmt, ast.If) and getattr(stmt.test, "id", None) == "TYPE_CHECKING":
            continue
        for node in ast.walk(stmt):
            if isinstance(node, ast.Import) and any(_within(a.name, "tacit") for a in node.names):
                lines.append(node.lineno)
            elif isinstance(node, ast.ImportFrom) and (node.level or _within(node.module or "", "tacit")):
                lines.append(node.lineno)
    return lines


def test_the_public_face_binds_its_names_lazily():
    """import_cycles excepts PUBLIC_FACE because its names are bound on first use: true only while
    tacit/__init__.py imports no tacit module as it runs (its TYPE_CHECKING block and __getattr__
    are what the walker reads instead)."""
    face = next(m for m in walk_package() if m.name == PUBLIC_FACE)
    assert eager_tacit_imports(face) == [], f"{face.path} imports tacit modules eagerly"
    eager = _synthetic(PUBLIC_FACE, "from typing import TYPE_CHECKING\nfrom tacit.entrypoints.llm import LLM\n", True)
    lazy = _synthetic(
        PUBLIC_FACE,
        "if TYPE_CHECKING:\n    from tacit.entrypoints.llm import LLM\n"
        "def __getattr__(name):\n    from tacit.platforms import huge_pages\n",
        True,
    )
    assert eager_tacit_imports(eager) == [2] and eager_tacit_imports(lazy) == []
