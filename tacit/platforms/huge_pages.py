"""Weights in 2 MB pages: torch's CPU allocator asked to use transparent huge pages.

A decode step streams every weight once. In 4 KB pages a 237 MB step (random:qwen3-moe-2b at
batch 1) crosses ~58,000 pages, each a TLB miss and a boundary the hardware prefetcher stops
at; in 2 MB pages, ~120. Measured on this Zen 4 host (THP in `madvise` mode, the common
distribution default, under which nothing gets huge pages unless asked): `tacit bench latency
--model random:qwen3-moe-2b --batch-sizes 1 --input-len 32 --output-len 64 --repeats 2
--num-kv-blocks 128 --peer llama.cpp`, three alternating pairs, 107-147 tok/s in 4 KB pages
against 161-168 in 2 MB ones (0.90-1.00x llama.cpp -> 1.06-1.15x); loading that 2 GB model
took 4.2-4.6 s instead of 1.9-2.1 (the kernel zeroes and compacts 2 MB pages).

`THP_MEM_ALLOC_ENABLE=1` is torch's switch (c10's alloc_cpu): allocations of 2 MB and more are
2 MB-aligned and madvise(MADV_HUGEPAGE)d. torch reads it once, at its first CPU allocation, and
`import torch` alone does not allocate, but importing the engine's modules does (a module-level
tensor such as loader/prequantized.py's _SHIFTS): set after `import tacit.engine.llm_engine`,
a 64 MB tensor got no huge pages; set after `import torch`, 62 MB of them. So this is not
called when the engine is built (too late) nor at `import tacit` (which changes nothing in the
process), but at the first use of a public name (`from tacit import LLM`, tacit/__init__.py)
and by the command line's main() before it imports the subcommands (tacit/cli.py). A process
that allocated tensors first, or that imports the engine's modules directly, keeps 4 KB pages
unless it calls this first. A value the user set (0 to turn it off) wins.
"""

from __future__ import annotations

import os

ENV = "THP_MEM_ALLOC_ENABLE"


def request_transparent_huge_pages() -> None:
    os.environ.setdefault(ENV, "1")
