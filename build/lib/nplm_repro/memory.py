"""Keep freed memory in the process instead of handing it back to the kernel after every batch.

glibc gives large freed blocks back to the kernel (mmap'd blocks, and the top of the heap past a trim
threshold), and the next allocation of the same size faults every page in again, zeroed by the kernel. Scoring
and training allocate |V|-wide blocks (a softmax over every word of the vocabulary for each window of a batch) of
the same sizes batch after batch, so without this the time goes to page faults in the kernel, not to arithmetic.
Raising glibc's mmap and trim thresholds keeps those blocks in the heap for the next batch. The cost is that the
process keeps its peak memory; elsewhere than glibc this does nothing. What it changes, measured: docs/performance.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def keep_freed_memory(limit: int = 1 << 30) -> bool:
    """Serve blocks up to `limit` bytes from the heap and never trim it below 2 x `limit`; False if not glibc."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, limit)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * limit))
