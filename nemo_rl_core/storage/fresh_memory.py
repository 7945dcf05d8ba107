"""Zeroed memory for large decoded tensors, faulted in as cheaply as the kernel allows.

Restoring the padded [B, S] tensors of a batch fills ~150 MB of fresh memory per 100 MB
read, and faulting it in is the decode's largest kernel cost. Measured with
``bench/storage.py --profile`` (the ragged columns of a 96 MB batch, 65 MB copied into
150 MB): 26-32 ms CPU in transparent huge pages, 70-90 ms in 4 KiB pages populated by
one ``mmap`` call (and 4 KiB pages faulted one by one cost more still). Huge pages are
asked for (``MADV_HUGEPAGE``) only while the kernel has enough free 2 MiB blocks: without
them a fault stalls on memory compaction (14-170 ms per 100 MB measured on a busy
machine), so then the populated 4 KiB pages are the steadier choice.
"""

import mmap

import numpy as np

_HUGE_PAGE_ORDER = 9  # 2 MiB blocks of 4 KiB pages
_PAGE_BYTES = 4096
_HEADROOM = 4  # ask for huge pages only if 4x the request is free in 2 MiB blocks
_MIN_HUGE_BYTES = 8 << 20  # below this, the fault count is small either way


def zeroed(count: int, dtype: np.dtype) -> np.ndarray:
    """A writable zeroed 1-d array of ``count`` ``dtype`` items in its own anonymous map."""
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        return np.zeros(count, dtype)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    huge = nbytes >= _MIN_HUGE_BYTES and _free_huge_block_bytes() >= _HEADROOM * nbytes
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        memory = mmap.mmap(-1, nbytes, flags=flags)
        memory.madvise(mmap.MADV_HUGEPAGE)  # faulted on first write, one fault per 2 MiB
    else:
        memory = mmap.mmap(-1, nbytes, flags=flags | getattr(mmap, "MAP_POPULATE", 0))
    return np.frombuffer(memory, dtype)


def _free_huge_block_bytes() -> int:
    """Free memory in blocks of at least 2 MiB (``/proc/buddyinfo``); 0 where unknown."""
    try:
        with open("/proc/buddyinfo") as file:
            lines = file.read().splitlines()
    except OSError:
        return 0
    total = 0
    for line in lines:
        counts = line.split()[4:]  # "Node 0, zone Normal <free blocks of order 0, 1, ...>"
        for order, count in enumerate(counts[_HUGE_PAGE_ORDER:], start=_HUGE_PAGE_ORDER):
            total += int(count) << order
    return total * _PAGE_BYTES
