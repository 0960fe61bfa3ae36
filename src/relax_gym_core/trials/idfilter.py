"""A fixed-size Bloom filter of the request ids a ledger file may hold.

Every create asks the store about an id that is almost always new; answering "never seen" from memory
spares two SQLite lookups on the hot path. A Bloom filter answers "certainly not" or "maybe" (then the
file is asked), in constant memory whatever the number of trials. Ids are never removed (an evicted id
stays a "maybe", which costs one lookup); once more ids went in than it was sized for, the owner
rebuilds it from the ids the file still holds (retention bounds them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

CAPACITY: Final = 1_000_000  # ids per (re)build before false positives pass ~1 %
BITS: Final = 9_600_000  # -n ln(0.01) / ln(2)^2 for n = CAPACITY: 1.2 MB
HASHES: Final = 7


class IdFilter:
    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._bits = bytearray(BITS // 8 + 1)
        self.added = 0
        for request_id in ids:
            self.add(request_id)

    @staticmethod
    def _positions(request_id: str) -> list[int]:
        # str's own hash: computed once per string and cached in it (dict lookups of the same id reuse
        # it). It is salted per process, which is fine: a filter lives and dies with its process.
        value = hash(request_id) & 0xFFFF_FFFF_FFFF_FFFF
        first, second = value & 0xFFFF_FFFF, (value >> 32) | 1
        return [(first + i * second) % BITS for i in range(HASHES)]

    def add(self, request_id: str) -> None:
        bits = self._bits
        for position in self._positions(request_id):
            bits[position >> 3] |= 1 << (position & 7)
        self.added += 1

    def __contains__(self, request_id: str) -> bool:
        bits = self._bits
        return all(bits[position >> 3] & (1 << (position & 7)) for position in self._positions(request_id))

    @property
    def full(self) -> bool:
        return self.added > CAPACITY
