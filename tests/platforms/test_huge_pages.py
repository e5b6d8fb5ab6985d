"""Importing tacit asks torch's CPU allocator for 2 MB pages (platforms/huge_pages.py), unless
the user said otherwise."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
PROBE = (
    "import tacit, torch, os; x = torch.empty(64 << 20, dtype=torch.uint8); x.fill_(1); "
    "huge = [l.split()[1] for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')]; "
    "print(os.environ['THP_MEM_ALLOC_ENABLE'], huge[0])"
)


def thp_mode() -> str | None:
    """The kernel's THP mode: always | madvise | never (None: no THP here)."""
    if not THP_MODE.exists():
        return None
    found = re.search(r"\[(\w+)\]", THP_MODE.read_text())
    return found.group(1) if found else None


def probe(env_value: str | None) -> tuple[str, int]:
    """(THP_MEM_ALLOC_ENABLE as tacit left it, kB of the process in huge pages after a 64 MB tensor)."""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    value, kb = out.stdout.split()
    return value, int(kb)


@pytest.mark.skipif(thp_mode() not in ("madvise", "always"), reason="this kernel gives no transparent huge pages")
def test_a_large_tensor_lands_in_huge_pages_after_import():
    value, kb = probe(None)
    # at least one 2 MB page (a fragmented host may not give all 32; off, madvise mode gives none)
    assert value == "1" and kb >= 2 << 10


def test_the_users_setting_wins():
    value, kb = probe("0")
    assert value == "0"
    if thp_mode() == "madvise":  # nothing madvised: no huge pages at all
        assert kb == 0
