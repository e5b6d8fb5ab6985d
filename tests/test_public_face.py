"""What a newcomer meets first. The README: short, its set-up commands the ones CI runs, its links
resolving. `import tacit`: cheap, the public names bound on first use (tacit/__init__.py, PEP 562),
so the bare import loads neither torch nor the engine and leaves the process as it was."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tacit

INIT = Path(tacit.__file__)
ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PUBLIC = [
    "LLM",
    "EngineArgs",
    "SamplingParams",
    "StructuredOutputsParams",
    "PoolingParams",
    "RequestOutput",
    "EmbeddingRequestOutput",
    "CompletionOutput",
    "Logprob",
]


def run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_a_bare_import_loads_no_torch_no_engine_and_changes_no_setting():
    found = run(
        "import json, os, sys; before = dict(os.environ); import tacit; "
        "print(json.dumps({'modules': sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tacit')), "
        "'env_changed': sorted(set(os.environ.items()) ^ set(before.items()))}))"
    )
    assert found == {"modules": ["tacit"], "env_changed": []}


def test_the_lazy_names_resolve_and_are_listed():
    found = run(
        "import json, tacit; names = dir(tacit); "
        "from tacit import LLM, EngineArgs; from tacit.entrypoints.llm import LLM as L; "
        "from tacit.config.engine_args import EngineArgs as E; from tacit.engine.arg_utils import EngineArgs as V; "
        "print(json.dumps({'dir': names, 'all': tacit.__all__, 'same': [LLM is L, EngineArgs is E, "
        "tacit.LLM is L, V is E], 'types': [type(getattr(tacit, n)).__name__ for n in tacit.__all__]}))"
    )
    assert set(PUBLIC) <= set(found["dir"]) and sorted(found["all"]) == sorted(PUBLIC)
    assert found["same"] == [True, True, True, True]  # V: vLLM's path, tacit.engine.arg_utils
    assert all(t in ("type", "ABCMeta", "EnumMeta") for t in found["types"]), found["types"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'tacit' has no attribute 'Nope'"):
        tacit.Nope  # noqa: B018
    with pytest.raises(ImportError):
        from tacit import Nope  # noqa: F401


def test_the_type_checking_imports_name_what_getattr_binds():
    """What type checkers (and tests/test_import_rules.py) read must be what __getattr__ returns."""
    tree = ast.parse(INIT.read_text())
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                typed.update({a.name: imp.module for a in imp.names})
    assert typed == tacit._LAZY and sorted(tacit.__all__) == sorted(tacit._LAZY)


def test_the_readme_reads_in_two_minutes():
    # Issue 35: at most ~120 lines; the long material lives in docs/ (mkdocs.yml's site).
    assert len(README.splitlines()) <= 120, len(README.splitlines())


def test_the_readme_shows_the_commands_ci_runs():
    """.ci/run runs "the README's two commands" (scripts/setup.sh installs): the same lines, in a bash block."""
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    ci = (ROOT / ".ci" / "run").read_text()
    for command in ("bash scripts/setup.sh", ".venv/bin/python -m pytest -q"):
        assert re.search(rf"^{re.escape(command)}(\s|$)", blocks, re.M), command
        assert command in ci, command
    # Install, chat, serve, a curl and a benchmark, each found from the README.
    for shown in (".venv/bin/tacit chat", ".venv/bin/tacit serve", "curl -s localhost:8000/v1/", "tacit bench latency"):
        assert shown in blocks, shown


def test_the_readme_links_resolve():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local, "the README links to the docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
