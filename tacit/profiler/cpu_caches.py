"""This machine's data caches, from sysfs: what a block's working set is measured against."""

from __future__ import annotations

from pathlib import Path

SYSFS = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size(text: str) -> int:
    text = text.strip()
    scale = _UNITS.get(text[-1:].upper(), 1)
    return int(text.rstrip("KMGkmg")) * scale


def cpu_caches(root: Path = SYSFS) -> dict[str, int]:
    """{"L1": bytes, "L2": bytes, "L3": bytes} of cpu0's data / unified caches (an L3 is shared
    by the cores of its package, an L1/L2 is cpu0's own); {} where sysfs has none."""
    out: dict[str, int] = {}
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = (index / "level").read_text().strip()
            size = _size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            out[f"L{level}"] = size
    return out


def level_holding(nbytes: float, caches: dict[str, int]) -> str:
    """The smallest cache `nbytes` fits in, else DRAM."""
    for level, size in sorted(caches.items(), key=lambda kv: kv[1]):
        if nbytes <= size:
            return level
    return "DRAM"
