"""The C paged-decode kernel (graft.kernels.cpu_ops): numerics, bad tables, build cache, dispatch."""

import pytest
import torch

import graft.kernels as K
from graft.errors import GraftConfigError
from graft.kernels import cpu_ops
from graft.kernels import reference as ref
from tests.kernels.paged_case import bad_block_tables, dense_attention, make_case

needs_c = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))


def _decode(impl, case):
    return impl.paged_attention_decode(case.q, case.k_cache, case.v_cache, case.block_tables,
                                       case.context_lens, case.scale)


@needs_c
@pytest.mark.parametrize("block_size,num_kv_heads,group,head_dim",
                         [(16, 2, 1, 64), (32, 3, 3, 72), (16, 1, 8, 128), (32, 2, 4, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_decode_matches_dense_and_reference(block_size, num_kv_heads, group, head_dim, threads):
    # ragged contexts: empty, one token, a block boundary, several blocks (unused table cells -1)
    lens = [0, 1, block_size, block_size + 1, 3 * block_size - 5, 77]
    case = make_case(lens, [1] * len(lens), block_size, num_kv_heads, group, head_dim)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = _decode(cpu_ops, case)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.double(), dense_attention(case), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, _decode(ref, case), atol=1e-6, rtol=1e-5)
    assert torch.equal(out[0], torch.zeros_like(out[0]))


@needs_c
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_is_the_same_alone_in_a_batch_and_on_any_thread_count(cache_dtype, head_dim):
    """A long context is cut into fixed 64-token pieces spread over the threads and merged:
    a sequence's output does not depend on the batch around it or on the thread count, and
    it still equals dense attention (here 1-300 tokens: 1 to 5 pieces)."""
    lens = [300, 1, 64, 65, 129, 7]
    case = make_case(lens, [1] * len(lens), 16, 2, 3, head_dim)
    k_cache, v_cache = case.k_cache.to(cache_dtype), case.v_cache.to(cache_dtype)
    before, outs = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            batch = cpu_ops.paged_attention_decode(case.q, k_cache, v_cache, case.block_tables,
                                                   case.context_lens, case.scale)
            alone = [cpu_ops.paged_attention_decode(case.q[i:i + 1], k_cache, v_cache,
                                                    case.block_tables[i:i + 1],
                                                    case.context_lens[i:i + 1], case.scale)
                     for i in range(len(lens))]
            assert torch.equal(batch, torch.cat(alone))
            outs.append(batch)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    if cache_dtype == torch.float32:
        torch.testing.assert_close(outs[0].double(), dense_attention(case), atol=1e-5, rtol=1e-5)


@needs_c
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_decode_half_precision(dtype, tol):
    case = make_case([40, 3, 16], [1, 1, 1], 16, 2, 3, 64, dtype=dtype)
    out = _decode(cpu_ops, case)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), dense_attention(case), atol=tol, rtol=tol)


@needs_c
def test_bad_block_table_names_the_row():
    case = make_case([20, 40], [1, 1], 16, 2, 2, 64)
    for tables in bad_block_tables(case):
        with pytest.raises(ValueError, match="block_tables row 1"):
            cpu_ops.paged_attention_decode(case.q, case.k_cache, case.v_cache, tables,
                                           case.context_lens, case.scale)
    with pytest.raises(ValueError, match="head_dim"):
        cpu_ops.paged_attention_decode(case.q[..., :32], case.k_cache, case.v_cache,
                                       case.block_tables, case.context_lens, case.scale)


@needs_c
def test_dispatch_picks_c_on_cpu_and_obeys_env(monkeypatch):
    case = make_case([33, 5], [1, 1], 16, 2, 2, 64)
    monkeypatch.setenv("GRAFT_KERNELS", "auto")
    assert K.backend_name(case.q) == "cpu"
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    assert K.backend_name(case.q) == "reference"
    monkeypatch.setenv("GRAFT_KERNELS", "cpu")
    torch.testing.assert_close(K.paged_attention_decode(case.q, case.k_cache, case.v_cache,
                                                        case.block_tables, case.context_lens,
                                                        case.scale), _decode(ref, case))
    with pytest.raises(GraftConfigError, match="float dtype"):  # mixed dtypes: no C path
        K.paged_attention_decode(case.q.double(), case.k_cache, case.v_cache, case.block_tables,
                                 case.context_lens, case.scale)


def test_unbuildable_kernels_fall_back_to_reference(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAFT_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")  # a compiler that always fails
    monkeypatch.setattr(cpu_ops, "_load", cpu_ops._load.__wrapped__)  # no memoized library
    assert not cpu_ops.available()
    assert "failed" in cpu_ops.unavailable_reason()
    assert list(tmp_path.iterdir()) == []  # no half-built library left behind
    case = make_case([33, 5], [1, 1], 16, 2, 2, 64)
    monkeypatch.setenv("GRAFT_KERNELS", "auto")
    assert K.backend_name(case.q) == "reference"
    torch.testing.assert_close(K.paged_attention_decode(case.q, case.k_cache, case.v_cache,
                                                        case.block_tables, case.context_lens,
                                                        case.scale), _decode(ref, case))
    monkeypatch.setenv("GRAFT_KERNELS", "cpu")
    with pytest.raises(GraftConfigError, match="GRAFT_KERNELS=cpu but building"):
        K.backend_name(case.q)


@needs_c
def test_build_is_cached_per_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAFT_KERNEL_CACHE", str(tmp_path))
    lib = cpu_ops._build(cpu_ops._compiler())
    assert lib.parent == tmp_path and lib.suffix == ".so"
    stamp = lib.stat().st_mtime_ns
    assert cpu_ops._build(cpu_ops._compiler()) == lib and lib.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [lib.name]
