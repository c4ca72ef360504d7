"""Buffers on 2 MB pages (graft.kernels.huge_pages): aligned, the right size and contents, and
backed by huge pages where the kernel's THP setting allows it; the engine's packed weights
and KV pool live in them."""

import mmap
import warnings
from pathlib import Path

import pytest
import torch

from graft.kernels import cpu_ops, huge_pages
from graft.serving import Engine, EngineConfig

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
thp_on = pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(),
                            reason="transparent huge pages are off on this machine")


def test_empty_is_aligned_and_writable():
    t = huge_pages.empty(5 * huge_pages.HUGE_PAGE + 123)
    assert t.dtype == torch.uint8 and t.numel() == 5 * huge_pages.HUGE_PAGE + 123
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    t.fill_(7)
    assert int(t.sum()) == 7 * t.numel()


@thp_on
def test_touched_buffers_are_on_huge_pages():
    t = huge_pages.empty(8 * huge_pages.HUGE_PAGE)
    assert huge_pages.backed_bytes(t) == 0  # nothing is mapped before the first write
    t.fill_(1)
    assert huge_pages.backed_bytes(t) >= 4 * huge_pages.HUGE_PAGE
    if "[madvise]" in THP.read_text():
        # a mapping nobody advised stays on 4 KB pages. (Not malloc'd memory: numpy advises
        # its large arrays, and malloc hands those heap pages out again to anyone.)
        plain = mmap.mmap(-1, 8 * huge_pages.HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ordinary = torch.frombuffer(plain, dtype=torch.uint8)
        ordinary.fill_(1)
        assert huge_pages.backed_bytes(ordinary) == 0


def test_zeros_and_gather_keep_values_and_outlive_their_sources():
    z = huge_pages.zeros((3, 5, 7), torch.bfloat16)
    assert z.shape == (3, 5, 7) and z.dtype == torch.bfloat16 and not z.any()
    src = [torch.arange(10, dtype=torch.int16), torch.randn(3, 5), torch.randint(0, 255, (999,), dtype=torch.uint8),
           torch.randn(1000, 300)]
    want = [t.clone() for t in src]
    got = huge_pages.gather(src)
    del src
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w) and g.data_ptr() % 64 == 0
    assert got[0].untyped_storage().data_ptr() == got[3].untyped_storage().data_ptr()  # one buffer
    del got[:3]
    assert torch.equal(got[0], want[3])  # a view keeps the buffer


def test_gather_frees_each_original_before_it_copies_the_next():
    """The engine's packed weights are gathered at load: in memory once, not twice."""
    import weakref

    src = [torch.randn(100, 30) for _ in range(4)]
    refs = [weakref.ref(t) for t in src]
    freed = []
    got = huge_pages.gather(src, place=lambda i, t: freed.append([r() is None for r in refs]))
    assert freed == [[True] * (i + 1) + [False] * (3 - i) for i in range(4)]
    assert src == [None] * 4 and len(got) == 4


@thp_on
@pytest.mark.skipif(not cpu_ops.available(), reason="the C kernels could not be built")
def test_engine_weights_and_kv_pool_are_on_huge_pages(tiny_llm_factory):
    engine = Engine.from_pretrained(tiny_llm_factory("llama"), EngineConfig(quantization="int8"))
    model = engine.runner.model
    packed = [w.packed["cpu"] for w in model.quantized_weights()]
    assert len({p.weight.untyped_storage().data_ptr() for p in packed}) == 1
    assert huge_pages.backed_bytes(packed[0].weight) > 0
    assert engine.runner.kv_cache.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert huge_pages.backed_bytes(engine.runner.kv_cache) > 0
