"""2 MB pages for torch's CPU allocator (platforms/huge_pages.py): asked for by the first use of a
public name (`from tacit import LLM`) and by the command line's main(), before torch's first
allocation; never by a bare `import tacit`; and never over the user's own setting."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
# After the lines under test: a 64 MB tensor, and how much of the process is in huge pages.
MEASURE = (
    "import torch; x = torch.empty(64 << 20, dtype=torch.uint8); x.fill_(1); "
    "huge = [l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')]; "
    "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), huge[0])"
)


def thp_mode() -> str | None:
    """The kernel's THP mode: always | madvise | never (None: no THP here)."""
    if not THP_MODE.exists():
        return None
    found = re.search(r"\[(\w+)\]", THP_MODE.read_text())
    return found.group(1) if found else None


HAS_THP = pytest.mark.skipif(
    thp_mode() not in ("madvise", "always"), reason="this kernel gives no transparent huge pages"
)


def probe(code: str, env_value: str | None = None, *args: str) -> tuple[str, int]:
    """(THP_MEM_ALLOC_ENABLE as the process left it, kB of it in huge pages after a 64 MB tensor)."""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    source = f"import os, sys\n{code}\n{MEASURE}"
    out = subprocess.run([sys.executable, "-c", source, *args], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    value, kb = out.stdout.split()[-2:]
    return value, int(kb)


@HAS_THP
def test_the_public_name_asks_before_torch_allocates():
    value, kb = probe("from tacit import LLM")
    # at least one 2 MB page (a fragmented host may not give all 32; off, madvise mode gives none)
    assert value == "1" and kb >= 2 << 10


def test_a_bare_import_asks_for_nothing():
    value, kb = probe("import tacit")
    assert value == "None"
    if thp_mode() == "madvise":  # nothing madvised: no huge pages at all
        assert kb == 0


@HAS_THP
def test_the_engine_built_after_from_tacit_import_llm_runs_on_huge_pages(tiny_llama):
    """The path a user script takes, in a fresh process: torch read the request at its first
    allocation (which importing the engine's modules makes, before the engine is built)."""
    code = (
        "from tacit import LLM\n"
        "assert os.environ.get('THP_MEM_ALLOC_ENABLE') == '1'\n"
        "llm = LLM(sys.argv[1], cpu_kernels=False, num_kv_blocks=16)\n"
        "assert llm.generate([[1, 2, 3]])"
    )
    value, kb = probe(code, None, str(tiny_llama[2]))
    assert value == "1" and kb >= 2 << 10


@HAS_THP
def test_the_command_line_asks_before_it_imports_torch():
    code = (
        "from tacit.cli import main\n"
        "assert 'torch' not in sys.modules and 'THP_MEM_ALLOC_ENABLE' not in os.environ\n"
        "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' in sys.modules"
    )
    value, kb = probe(code)
    assert value == "1" and kb >= 2 << 10


def test_the_users_setting_wins():
    value, kb = probe("from tacit import LLM", "0")
    assert value == "0"
    if thp_mode() == "madvise":
        assert kb == 0
