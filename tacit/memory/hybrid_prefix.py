"""The prefix cache over several KV cache groups (sliding-window beside full-attention layers).

Each group caches its own blocks of a prefix (its layers' KV of those tokens), named by the
block's hash and the group (group_hash). A hit of L blocks needs, in a full-attention group,
every block 0..L-1; in a sliding-window group only the blocks the next query's window reaches:
from position L * block_size - window + 1 on (a block it gave back while its request decoded,
or one evicted since, is not needed). vLLM's hybrid manager finds the same hit: the longest
prefix the full groups hold, shortened until every sliding group holds its window there.
"""

from __future__ import annotations

from tacit.memory.block_hash import BlockHash
from tacit.memory.block_pool import BlockPool


def group_hash(block_hash: BlockHash, group: int) -> BlockHash:
    """Group `group`'s name for a block of these tokens (group 0 keeps the plain hash, so a
    model of one group caches exactly as before)."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")


def find_hybrid_hit(
    pool: BlockPool, hashes: list[BlockHash], windows: tuple[int | None, ...], block_size: int
) -> tuple[list[int], ...]:
    """Per group, the table entries of the longest usable hit over `hashes` (the prefix's block
    hashes, the last token's block already left out): a full group's blocks, a sliding group's
    block 0 for each position behind the window then its blocks. Empty lists when none."""
    length = len(hashes)
    full = {g: pool.lookup([group_hash(h, g) for h in hashes]) for g, w in enumerate(windows) if w is None}
    for blocks in full.values():
        length = min(length, len(blocks))
    while length > 0:
        hit: list[list[int]] = []
        for g, window in enumerate(windows):
            if window is None:
                hit.append(full[g][:length])
                continue
            first = max(length * block_size - window + 1, 0) // block_size
            found = [pool.lookup([group_hash(hashes[i], g)]) for i in range(first, length)]
            if not all(found):
                break
            hit.append([0] * first + [b[0] for b in found])
        else:
            return tuple(hit)
        length -= 1
    return tuple([] for _ in windows)
