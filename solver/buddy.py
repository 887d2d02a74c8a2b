"""A buddy allocator of aligned power-of-two rank blocks.

Blocks handed out start at a multiple of their size, which is exactly the alignment the layout
rules ask of children (inside a node) and of parents (across the cluster).
"""

from __future__ import annotations


def power_of_two_blocks(start: int, size: int) -> list[tuple[int, int]]:
    """``[start, start + size)`` as aligned power-of-two blocks, largest first (``start`` must be
    aligned to the largest)."""
    blocks, at = [], start
    for bit in reversed(range(size.bit_length())):
        if size & (1 << bit):
            blocks.append((at, 1 << bit))
            at += 1 << bit
    return blocks


class Buddy:
    """Free aligned blocks of one segment of ranks."""

    def __init__(self, start: int, size: int) -> None:
        self.free: list[tuple[int, int]] = power_of_two_blocks(start, size)

    def take(self, size: int) -> int | None:
        """Start of a free block of ``size`` split off the smallest fitting block, or None."""
        block = None  # the least (size, start) of the blocks of at least ``size``
        for b in self.free:
            if b[1] >= size and (block is None or (b[1], b[0]) < (block[1], block[0])):
                block = b
        if block is None:
            return None
        self.free.remove(block)
        start, have = block
        while have > size:
            have //= 2
            self.free.append((start + have, have))
        return start

    def smallest_fit(self, size: int) -> int | None:
        return min((b[1] for b in self.free if b[1] >= size), default=None)

    def take_exact(self, block: tuple[int, int]) -> bool:
        if block in self.free:
            self.free.remove(block)
            return True
        return False

    def grow(self, start: int, size: int, origin: int) -> int | None:
        """Start of the doubled block if the buddy of ``[start, start+size)`` (aligned relative
        to ``origin``) is free, taking it; None otherwise."""
        offset = start - origin
        buddy = (origin + (offset ^ size), size)
        if not self.take_exact(buddy):
            return None
        return min(start, buddy[0])
