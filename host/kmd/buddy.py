"""Binary buddy allocator for VRAM, modelled on Linux drm_buddy (drivers/gpu/drm/drm_buddy.c).

The managed space [0, size) is cut into power-of-two *root* blocks (a size that is not a
power of two gives several roots, largest first). Every block has an offset, an order
(its size is chunk_size << order) and a state: FREE (on the free list of its order),
ALLOCATED (handed to a caller) or SPLIT (its two halves, `left` and `right`, are the
blocks). Splitting replaces a free block by two free children; freeing a block merges it
with its buddy, and upward, as long as the buddy is free — so, between calls, no two free
buddies exist and a split block always has an allocated descendant.

alloc_blocks(size) follows drm_buddy_alloc_blocks():
  * the size is rounded up to the chunk size (drm_buddy wants it aligned; we round),
    then up to min_block_size; CONTIGUOUS rounds up to a power of two instead;
  * a request of 2**k chunks is served by one block; any other request becomes several
    blocks, largest first: take the largest order <= the pages still needed, lowering the
    order on failure down to min_block_size; the blocks need not be contiguous;
  * if rounding made the allocation larger than asked, the last block is *trimmed*: it is
    freed and the exact range [offset, offset + wanted) is allocated back out of it, so
    the tail returns to the free lists as smaller blocks;
  * start + size == end asks for exactly that range;
  * RANGE restricts the blocks to [start, end) (a depth-first walk of the trees, splitting
    only blocks that overlap the range, as __alloc_range_bias() does); TOPDOWN prefers the
    highest offsets; without it the lowest-offset block of the smallest fitting order wins
    (deterministic, best fit);
  * CONTIGUOUS that fails as one power-of-two block "tries harder": the first (or, with
    TOPDOWN, last) free run of at least the wanted size is allocated as an exact range —
    the result is then several blocks that together form one contiguous range.
On failure nothing stays allocated or split: the state is exactly what it was before the
call and OutOfMemory is raised. Free lists are a dict per order plus two lazy heaps, so
taking the lowest/highest free block of an order costs O(log n).
"""

from __future__ import annotations

import heapq

from pvgpu.host.kmd.errors import InvalidArgument, OutOfMemory

# Allocation flags (drm_buddy's DRM_BUDDY_*_ALLOCATION).
RANGE = 1 << 0
TOPDOWN = 1 << 1
CONTIGUOUS = 1 << 2

# Block states.
ALLOCATED = 1
FREE = 2
SPLIT = 3
_STATE_NAMES = {ALLOCATED: "allocated", FREE: "free", SPLIT: "split"}


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def round_up(x: int, a: int) -> int:
    return -(-x // a) * a


class Block:
    """One node of a buddy tree; `size` bytes at `offset` of the managed space."""

    __slots__ = ("offset", "order", "size", "state", "parent", "left", "right")

    def __init__(self, offset: int, order: int, size: int, parent: "Block | None"):
        self.offset = offset
        self.order = order
        self.size = size
        self.state = FREE
        self.parent = parent
        self.left = None
        self.right = None

    @property
    def end(self) -> int:
        return self.offset + self.size

    def buddy(self) -> "Block | None":
        p = self.parent
        if p is None:
            return None
        return p.right if p.left is self else p.left

    def __repr__(self) -> str:
        return (f"Block(offset={self.offset:#x}, size={self.size:#x}, order={self.order}, "
                f"{_STATE_NAMES[self.state]})")


class _FreeList:
    """Free blocks of one order: offset -> Block, with lazy min/max heaps of offsets."""

    __slots__ = ("blocks", "_lo", "_hi")

    def __init__(self):
        self.blocks = {}
        self._lo = []
        self._hi = []

    def __len__(self) -> int:
        return len(self.blocks)

    def add(self, block: Block) -> None:
        self.blocks[block.offset] = block
        heapq.heappush(self._lo, block.offset)
        heapq.heappush(self._hi, -block.offset)
        if len(self._lo) > 2 * len(self.blocks) + 64:
            self._lo = list(self.blocks)
            heapq.heapify(self._lo)
            self._hi = [-o for o in self.blocks]
            heapq.heapify(self._hi)

    def remove(self, block: Block) -> None:
        del self.blocks[block.offset]

    def lowest(self) -> "Block | None":
        lo, blocks = self._lo, self.blocks
        while lo and lo[0] not in blocks:
            heapq.heappop(lo)
        return blocks[lo[0]] if lo else None

    def highest(self) -> "Block | None":
        hi, blocks = self._hi, self.blocks
        while hi and -hi[0] not in blocks:
            heapq.heappop(hi)
        return blocks[-hi[0]] if hi else None


class _NoSpace(Exception):
    pass


class BuddyAllocator:
    """drm_buddy-style allocator of [0, size) in chunks of `chunk_size` bytes."""

    def __init__(self, size: int, chunk_size: int = 4096):
        if not _is_pow2(chunk_size):
            raise InvalidArgument(f"chunk size {chunk_size} is not a power of two")
        size -= size % chunk_size
        if size <= 0:
            raise InvalidArgument("buddy allocator smaller than one chunk")
        self.chunk_size = chunk_size
        self._chunk_shift = chunk_size.bit_length() - 1
        self.size = size
        self.avail = size
        self.max_order = (size >> self._chunk_shift).bit_length() - 1
        self._free = [_FreeList() for _ in range(self.max_order + 1)]
        self.roots = []
        offset, remaining = 0, size
        while remaining:
            root_size = 1 << (remaining.bit_length() - 1)
            root = Block(offset, (root_size >> self._chunk_shift).bit_length() - 1, root_size, None)
            self.roots.append(root)
            self._free[root.order].add(root)
            offset += root_size
            remaining -= root_size

    # ------------------------------------------------------------------ stats
    @property
    def used(self) -> int:
        return self.size - self.avail

    def free_blocks_per_order(self) -> dict:
        """{order: number of free blocks} for every order that has free blocks."""
        return {o: len(fl) for o, fl in enumerate(self._free) if len(fl)}

    def largest_free_block(self) -> int:
        """Size in bytes of the largest free block (0 when full)."""
        for o in range(self.max_order, -1, -1):
            if len(self._free[o]):
                return self.chunk_size << o
        return 0

    def stats(self) -> dict:
        largest = self.largest_free_block()
        return {
            "size": self.size,
            "avail": self.avail,
            "chunk_size": self.chunk_size,
            "free_blocks": self.free_blocks_per_order(),
            "free_block_count": sum(len(fl) for fl in self._free),
            "largest_free_block": largest,
            # 0.0 = all free memory in one block; close to 1.0 = scattered in small blocks
            "fragmentation": (1.0 - largest / self.avail) if self.avail else 0.0,
        }

    # ------------------------------------------------------------------ tree operations
    def _split(self, block: Block) -> None:
        assert block.state == FREE and block.order > 0
        self._free[block.order].remove(block)
        half = block.size >> 1
        block.left = Block(block.offset, block.order - 1, half, block)
        block.right = Block(block.offset + half, block.order - 1, half, block)
        block.state = SPLIT
        fl = self._free[block.order - 1]
        fl.add(block.left)
        fl.add(block.right)

    def _take(self, block: Block) -> None:
        assert block.state == FREE
        self._free[block.order].remove(block)
        block.state = ALLOCATED
        self.avail -= block.size

    def _free_block(self, block: Block) -> None:
        """Free an allocated block and merge it upward while its buddy is free."""
        assert block.state == ALLOCATED
        self.avail += block.size
        block.state = FREE
        while block.parent is not None:
            buddy = block.buddy()
            if buddy.state != FREE:
                break
            self._free[buddy.order].remove(buddy)
            parent = block.parent
            parent.left = parent.right = None
            parent.state = FREE
            block = parent
        self._free[block.order].add(block)

    def _unsplit(self, block: Block) -> None:
        """Undo a split whose two halves are both still free leaves."""
        if block.state == SPLIT and block.left.state == FREE and block.right.state == FREE:
            self._free[block.left.order].remove(block.left)
            self._free[block.right.order].remove(block.right)
            block.left.state = block.right.state = FREE
            block.left = block.right = None
            block.state = FREE
            self._free[block.order].add(block)

    def _undo(self, taken: list, split: list) -> None:
        for b in reversed(taken):
            self._free_block(b)
        for b in reversed(split):
            self._unsplit(b)

    # ------------------------------------------------------------------ allocation paths
    def _alloc_exact(self, start: int, size: int, roots=None) -> list:
        """Allocate exactly [start, start + size) (drm __alloc_range); -> blocks by offset."""
        end = start + size
        stack = list(reversed(roots if roots is not None else self.roots))
        taken, split = [], []
        while stack:
            b = stack.pop()
            if b.end <= start or b.offset >= end:
                continue
            if b.state == ALLOCATED:
                self._undo(taken, split)
                raise _NoSpace
            if b.state == FREE and b.offset >= start and b.end <= end:
                self._take(b)
                taken.append(b)
                continue
            if b.state == FREE:
                self._split(b)
                split.append(b)
            stack.append(b.right)
            stack.append(b.left)
        return taken

    def _alloc_in_range(self, order: int, start: int, end: int, topdown: bool) -> "Block | None":
        """A free block of exactly `order` inside [start, end) (drm __alloc_range_bias)."""
        req = self.chunk_size << order
        stack = list(self.roots if topdown else reversed(self.roots))
        while stack:
            b = stack.pop()
            if b.order < order or b.end <= start or b.offset >= end or b.state == ALLOCATED:
                continue
            contained = b.offset >= start and b.end <= end
            if not contained:
                lo, hi = max(b.offset, start), min(b.end, end)
                if (hi // req) * req <= round_up(lo, req):
                    continue  # the overlap cannot hold an aligned block of this order
            if contained and b.order == order:
                if b.state == FREE:
                    return b
                continue
            if b.state == FREE:
                # Only split a free block that is known to contain an aligned, in-range
                # block of the wanted order: the walk then cannot fail inside it.
                self._split(b)
            if topdown:
                stack.append(b.left)
                stack.append(b.right)
            else:
                stack.append(b.right)
                stack.append(b.left)
        return None

    def _alloc_from_freelist(self, order: int, topdown: bool) -> "Block | None":
        if topdown:
            best = None
            for o in range(order, self.max_order + 1):
                b = self._free[o].highest()
                if b is not None and (best is None or b.offset > best.offset):
                    best = b
            block = best
        else:
            block = None
            for o in range(order, self.max_order + 1):
                block = self._free[o].lowest()
                if block is not None:
                    break
        if block is None:
            return None
        while block.order > order:
            self._split(block)
            block = block.right if topdown else block.left
        return block

    def _free_runs(self, start: int, end: int) -> list:
        """Maximal runs of free chunks, clipped to [start, end), as (offset, end) by offset."""
        free = sorted((b.offset, b.end) for fl in self._free for b in fl.blocks.values())
        runs = []
        for s, e in free:
            s, e = max(s, start), min(e, end)
            if s >= e:
                continue
            if runs and runs[-1][1] == s:
                runs[-1] = (runs[-1][0], e)
            else:
                runs.append((s, e))
        return runs

    def _alloc_contig_try_harder(self, size: int, start: int, end: int, topdown: bool) -> list:
        runs = self._free_runs(start, end)
        if topdown:
            runs.reverse()
        for s, e in runs:
            if e - s >= size:
                return self._alloc_exact(e - size if topdown else s, size)
        raise _NoSpace

    def _trim(self, block: Block, new_size: int) -> list:
        """Shrink an allocated block to its first new_size bytes; the tail becomes free."""
        assert block.state == ALLOCATED and 0 < new_size <= block.size
        if new_size == block.size:
            return [block]
        self.avail += block.size
        block.state = FREE
        self._free[block.order].add(block)
        pieces = self._alloc_exact(block.offset, new_size, roots=[block])
        return pieces

    # ------------------------------------------------------------------ public API
    def alloc_blocks(self, size: int, *, start: int = 0, end: int | None = None,
                     min_block_size: int | None = None, flags: int = 0) -> list:
        """Allocate `size` bytes (rounded up to the chunk size) -> list of Block.

        Raises OutOfMemory, leaving the allocator unchanged, when the request cannot be
        met, and InvalidArgument for malformed parameters."""
        chunk = self.chunk_size
        if end is None:
            end = self.size
        if min_block_size is None:
            min_block_size = chunk
        if not isinstance(size, int) or size <= 0:
            raise InvalidArgument(f"bad allocation size {size!r}")
        if not _is_pow2(min_block_size) or min_block_size < chunk:
            raise InvalidArgument(f"min_block_size {min_block_size} must be a power of two "
                                  f">= the chunk size {chunk}")
        if start % chunk or end % chunk or not 0 <= start < end <= self.size:
            raise InvalidArgument(f"bad range [{start:#x}, {end:#x})")
        size = round_up(size, chunk)
        if size > end - start or size > self.avail:
            raise OutOfMemory(f"{size} bytes requested, {self.avail} available")
        use_range = bool(flags & RANGE) or start != 0 or end != self.size
        topdown = bool(flags & TOPDOWN)

        if use_range and end - start == size:
            try:
                return self._alloc_exact(start, size)
            except _NoSpace:
                raise OutOfMemory(f"range [{start:#x}, {end:#x}) is not free") from None

        original_size = size
        if flags & CONTIGUOUS:
            size = max(1 << (size - 1).bit_length(), min_block_size)
            min_block_size = size
        elif size % min_block_size:
            size = round_up(size, min_block_size)
        pages = size >> self._chunk_shift
        min_order = (min_block_size >> self._chunk_shift).bit_length() - 1
        order = min(pages.bit_length() - 1, self.max_order)

        allocated = []
        try:
            if min_order > self.max_order or size > end - start:
                raise _NoSpace
            while pages:
                order = min(order, pages.bit_length() - 1)
                while True:
                    if use_range:
                        block = self._alloc_in_range(order, start, end, topdown)
                    else:
                        block = self._alloc_from_freelist(order, topdown)
                    if block is not None:
                        break
                    if order == min_order:
                        raise _NoSpace
                    order -= 1
                self._take(block)
                allocated.append(block)
                pages -= 1 << order
        except _NoSpace:
            self._undo(allocated, [])
            if flags & CONTIGUOUS:
                try:
                    return self._alloc_contig_try_harder(original_size, start, end, topdown)
                except _NoSpace:
                    pass
            raise OutOfMemory(f"cannot allocate {original_size} bytes "
                              f"({self.avail} available, largest free block "
                              f"{self.largest_free_block()})") from None

        if original_size != size:
            last = allocated.pop()
            excess = size - original_size
            allocated.extend(self._trim(last, last.size - excess))
        return allocated

    def free_blocks(self, blocks) -> None:
        """Free blocks returned by alloc_blocks; buddies merge upward."""
        blocks = list(blocks)
        seen = set()
        for b in blocks:
            if not isinstance(b, Block) or b.state != ALLOCATED or id(b) in seen:
                raise InvalidArgument(f"{b!r} is not an allocated block")
            root = b
            while root.parent is not None:
                root = root.parent
            if not any(root is r for r in self.roots):
                raise InvalidArgument(f"{b!r} does not belong to this allocator")
            seen.add(id(b))
        for b in blocks:
            self._free_block(b)

    # ------------------------------------------------------------------ debugging
    def check(self) -> None:
        """Assert the structural invariants (used by the tests)."""
        free_total = 0
        listed = {(o, off) for o, fl in enumerate(self._free) for off in fl.blocks}
        seen_free = set()
        offset = 0
        for root in self.roots:
            assert root.offset == offset
            offset = root.end
            stack = [root]
            while stack:
                b = stack.pop()
                assert b.size == self.chunk_size << b.order
                if b.state == SPLIT:
                    assert b.left.parent is b and b.right.parent is b
                    assert b.left.offset == b.offset and b.right.offset == b.offset + b.size // 2
                    assert not (b.left.state == FREE and b.right.state == FREE), "unmerged buddies"
                    stack += [b.left, b.right]
                else:
                    assert b.left is None and b.right is None
                    if b.state == FREE:
                        free_total += b.size
                        seen_free.add((b.order, b.offset))
                        assert self._free[b.order].blocks[b.offset] is b
        assert offset == self.size
        assert listed == seen_free
        assert free_total == self.avail
