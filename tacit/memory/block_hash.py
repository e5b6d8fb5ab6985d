"""Block hashes for the prefix cache: each full block of a request's tokens is named by a hash
chain, sha256(parent block's hash, the block's token ids, the request's cache salt), vLLM's
scheme. Two requests share a block only when every token before it and in it is the same and
they carry the same salt (a tenant's cache_salt: requests with different salts never share a
block, so one tenant cannot time another's prompts through the cache). sha256 rather than
Python's hash(): a collision would hand one prompt another's KV, and the digest costs ~1 us a
block (16 tokens), against the milliseconds a block's prefill takes.
"""

from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes


def hash_block_tokens(parent: BlockHash | None, token_ids: list[int], salt: bytes = b"") -> BlockHash:
    h = hashlib.sha256(parent or b"\0" * 32)
    h.update(array("q", token_ids).tobytes())
    h.update(salt)
    return h.digest()


def extend_block_hashes(hashes: list[BlockHash], token_ids: list[int], block_size: int, salt: str | None) -> None:
    """Append the hashes of the full blocks of token_ids that `hashes` does not cover yet (a
    request's list grows as its tokens do; a partly filled block has none)."""
    extra = salt.encode() if salt else b""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size], extra))
