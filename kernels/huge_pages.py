"""CPU buffers on 2 MB pages (Linux transparent huge pages, asked for with madvise).

Why: a decode step streams every weight once, and the KV cache is read from all over a large
pool. On 4 KB pages each page of the stream costs a TLB miss, and in a VM a page walk is
nested and slow; here one core read a 256 MB buffer at 15-17 GB/s on 4 KB pages and 28 GB/s
on 2 MB pages (two cores: 21 vs 30 GB/s). torch's allocator asks for huge pages only when
THP_MEM_ALLOC_ENABLE is set before torch starts, and then only per allocation of 2 MB or
more, while most packed linears are smaller; so the engine gathers its packed weights into
one buffer from here, and allocates its KV pool here.

Where THP is off (`never`), or on other systems, the memory is ordinary: nothing fails.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import warnings

import torch

HUGE_PAGE = 2 << 20
TRIM_EVERY = 64 << 20  # gather: freed originals handed back to the OS every this many bytes


def empty(nbytes: int) -> torch.Tensor:
    """An uninitialized uint8 CPU tensor of nbytes on fresh anonymous memory (mmap, never
    touched: the kernel picks the page size at the first write), starting on a 2 MB boundary,
    with the kernel asked to back it with 2 MB pages. The mapping is released when the tensor
    and every view of it are gone."""
    size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE
    # private (a shared anonymous map is shmem, whose THP setting is another one), and our
    # own mapping: glibc could hand back heap pages that were already touched
    area = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -_address(area) % HUGE_PAGE
    if hasattr(area, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            area.madvise(mmap.MADV_HUGEPAGE, start, size)
        except OSError:  # advice only: THP compiled out, say
            pass
    with warnings.catch_warnings():  # "non-writable buffer": it is writable
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(area, dtype=torch.uint8)  # holds `area` while it lives
    return raw[start:start + nbytes]


def _address(area: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(area))


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype) on CPU, on 2 MB pages."""
    return empty(math.prod(shape) * dtype.itemsize).view(dtype).view(shape).zero_()


def return_freed_heap() -> None:
    """Hand the pages glibc keeps of freed allocations (those under its mmap threshold, a few
    MB: most weights and their temporaries) back to the OS; free() alone leaves them resident.
    Nothing happens without glibc."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def gather(tensors: list[torch.Tensor], align: int = 64, place=None) -> list[torch.Tensor]:
    """Copies of tensors (each contiguous) side by side in one buffer on 2 MB pages, each
    starting `align` bytes aligned; the buffer lives as long as any of the copies. The list's
    entries are dropped as they are copied, and `place(i, copy)` (when given) is called right
    after: a caller that swaps its own reference there frees each original before the next is
    copied, so the weights are in memory once and a bit, not twice (-1 GB at the peak of a
    1.5B int4 load)."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // align) * align
    buf = empty(total)
    out, copied = [], 0
    for i, (off, n) in enumerate(zip(offsets, sizes)):
        t, tensors[i] = tensors[i], None
        view = buf[off:off + n].view(t.dtype).view(t.shape)
        view.copy_(t)
        del t
        if place is not None:
            place(i, view)
            copied += n
            if copied >= TRIM_EVERY:  # the originals freed so far are resident until trimmed
                return_freed_heap()
                copied = 0
        out.append(view)
    return out


def backed_bytes(t: torch.Tensor) -> int:
    """Bytes of t's pages the kernel holds as huge pages (AnonHugePages of the mappings t
    lies in, /proc/self/smaps), 0 where that cannot be read: for tests and logs."""
    lo = t.data_ptr()
    hi = lo + t.numel() * t.element_size()
    found, inside = 0, False
    try:
        lines = open("/proc/self/smaps").read().splitlines()
    except OSError:
        return 0
    for line in lines:
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            a, b = (int(x, 16) for x in head.split("-"))
            inside = a < hi and lo < b
        elif inside and head == "AnonHugePages:":
            found += int(line.split()[1]) * 1024
    return found
