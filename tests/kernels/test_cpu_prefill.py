"""The C paged-prefill kernel (graft.kernels.cpu_ops.paged_attention_prefill): numerics against
dense attention and the reference, chunks after a cached prefix, cache dtypes, independence from
the batch and the threads, bad input, and dispatch."""

import pytest
import torch

import graft.kernels as K
from graft.kernels import cpu_ops
from graft.kernels import reference as ref
from tests.kernels.paged_case import bad_block_tables, dense_attention, make_case

needs_c = pytest.mark.skipif(not (cpu_ops.available() and cpu_ops.supports_prefill(
    torch.zeros(1, 1, 64), torch.zeros(1, 1, 1, 64))), reason="no C prefill kernel in this build")


def _prefill(impl, case, k_cache=None, v_cache=None, **scales):
    return impl.paged_attention_prefill(case.q, case.k_cache if k_cache is None else k_cache,
                                        case.v_cache if v_cache is None else v_cache,
                                        case.block_tables, case.cu_seqlens_q, case.context_lens,
                                        case.scale, **scales)


def _on_threads(threads, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


@needs_c
@pytest.mark.parametrize("block_size,num_kv_heads,group,head_dim",
                         [(16, 3, 3, 64), (32, 2, 6, 128), (8, 1, 1, 72), (16, 2, 7, 80),
                          (16, 1, 200, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_prefill_matches_dense_and_reference(block_size, num_kv_heads, group, head_dim, threads):
    # whole prompts, a chunk after a cached prefix, one query, an empty chunk, a prompt past
    # one tile of queries and one pass of keys (130 and 300 > 128 rows / group, > 64 keys)
    lens, q_lens = [130, 300, 41, 5, 17, 1], [130, 77, 1, 0, 17, 1]
    case = make_case(lens, q_lens, block_size, num_kv_heads, group, head_dim, seed=3)
    out = _on_threads(threads, lambda: _prefill(cpu_ops, case))
    torch.testing.assert_close(out.double(), dense_attention(case), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, _prefill(ref, case), atol=2e-6, rtol=1e-5)


@needs_c
def test_rows_of_no_sequence_are_zero_like_the_reference():
    case = make_case([20, 9], [4, 3], 16, 2, 2, 64)
    q = torch.cat([case.q, torch.randn(5, *case.q.shape[1:])])  # 5 rows after the last chunk
    cu = case.cu_seqlens_q + 2
    q = torch.cat([torch.randn(2, *q.shape[1:]), q])  # and 2 before the first
    args = (case.k_cache, case.v_cache, case.block_tables, cu, case.context_lens, case.scale)
    out = cpu_ops.paged_attention_prefill(q, *args)
    torch.testing.assert_close(out, ref.paged_attention_prefill(q, *args), atol=2e-6, rtol=1e-5)
    assert not out[:2].any() and not out[-5:].any()


@needs_c
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_prefill_is_the_same_alone_in_a_batch_and_on_any_thread_count(cache_dtype):
    """Work items are fixed tiles of one sequence's queries and one kv head: a sequence's
    output does not depend on the sequences beside it or on the thread count."""
    lens, q_lens = [300, 64, 65, 129, 7], [300, 30, 65, 1, 7]
    case = make_case(lens, q_lens, 16, 2, 3, 64, seed=5)
    k_cache, v_cache = case.k_cache.to(cache_dtype), case.v_cache.to(cache_dtype)
    cu, outs = case.cu_seqlens_q.tolist(), []
    for threads in (1, 2):
        batch = _on_threads(threads, lambda: _prefill(cpu_ops, case, k_cache, v_cache))
        for i in range(len(lens)):
            alone = cpu_ops.paged_attention_prefill(
                case.q[cu[i]:cu[i + 1]], k_cache, v_cache, case.block_tables[i:i + 1],
                torch.tensor([0, q_lens[i]], dtype=torch.int32), case.context_lens[i:i + 1],
                case.scale)
            assert torch.equal(batch[cu[i]:cu[i + 1]], alone), f"sequence {i}, {threads} threads"
        outs.append(batch)
    assert torch.equal(outs[0], outs[1])


@needs_c
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_prefill_half_precision(dtype, tol):
    case = make_case([90, 3, 16], [90, 2, 16], 16, 2, 3, 64, dtype=dtype)
    out = _prefill(cpu_ops, case)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), dense_attention(case), atol=tol, rtol=tol)
    torch.testing.assert_close(out, _prefill(ref, case), atol=tol, rtol=tol)


@needs_c
def test_prefill_reads_bf16_and_int8_caches_under_fp32_queries_like_the_reference():
    case = make_case([150, 40], [150, 12], 16, 2, 4, 64, seed=7)
    bf_k, bf_v = case.k_cache.bfloat16(), case.v_cache.bfloat16()
    torch.testing.assert_close(_prefill(cpu_ops, case, bf_k, bf_v),
                               _prefill(ref, case, bf_k, bf_v), atol=2e-6, rtol=1e-5)
    (k8, ks), (v8, vs) = ref.quantize_kv(case.k_cache), ref.quantize_kv(case.v_cache)
    got = _prefill(cpu_ops, case, k8, v8, k_scale=ks, v_scale=vs)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, _prefill(ref, case, k8, v8, k_scale=ks, v_scale=vs),
                               atol=2e-6, rtol=1e-5)


@needs_c
def test_bad_prefill_input_is_a_clear_error():
    case = make_case([20, 40], [20, 8], 16, 2, 2, 64)
    for tables in bad_block_tables(case):
        with pytest.raises(ValueError, match="block_tables row 1"):
            cpu_ops.paged_attention_prefill(case.q, case.k_cache, case.v_cache, tables,
                                            case.cu_seqlens_q, case.context_lens, case.scale)
    for impl in (cpu_ops, ref):
        lens = case.context_lens.clone()
        lens[1] = 7  # 8 queries over 7 cached tokens
        with pytest.raises(ValueError, match=r"sequence 1 has 8 queries but context_lens\[1\]=7"):
            impl.paged_attention_prefill(case.q, case.k_cache, case.v_cache, case.block_tables,
                                         case.cu_seqlens_q, lens, case.scale)
        cu = case.cu_seqlens_q.clone()
        cu[2] = 40  # past q's 28 rows
        with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing offsets"):
            impl.paged_attention_prefill(case.q, case.k_cache, case.v_cache, case.block_tables,
                                         cu, case.context_lens, case.scale)


@needs_c
def test_dispatch_runs_the_c_prefill_where_it_applies(monkeypatch):
    case = make_case([33, 5], [33, 5], 16, 2, 2, 64)
    calls = []
    real = cpu_ops.paged_attention_prefill
    monkeypatch.setattr(cpu_ops, "paged_attention_prefill",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for mode, c_runs in (("auto", 1), ("cpu", 1), ("reference", 0)):
        monkeypatch.setenv("GRAFT_KERNELS", mode)
        calls.clear()
        out = K.paged_attention_prefill(case.q, case.k_cache, case.v_cache, case.block_tables,
                                        case.cu_seqlens_q, case.context_lens, case.scale)
        assert len(calls) == c_runs, mode
        torch.testing.assert_close(out, _prefill(ref, case), atol=2e-6, rtol=1e-5)
    # a head size the kernel does not take (not a multiple of 4) keeps the reference, also
    # under GRAFT_KERNELS=cpu ("wherever they apply")
    odd = make_case([9], [9], 16, 1, 2, 6)
    monkeypatch.setenv("GRAFT_KERNELS", "cpu")
    calls.clear()
    out = K.paged_attention_prefill(odd.q, odd.k_cache, odd.v_cache, odd.block_tables,
                                    odd.cu_seqlens_q, odd.context_lens, odd.scale)
    assert not calls
    torch.testing.assert_close(out.double(), dense_attention(odd), atol=1e-5, rtol=1e-5)


@needs_c
def test_scores_far_below_zero_keep_their_softmax():
    """Every score near -2000: the softmax must shift by the largest real score (a padded key
    of a score block, or a shift by 0, would leave every exponential at zero and the output
    NaN)."""
    case = make_case([130, 67, 70], [130, 67, 3], 16, 2, 3, 64, seed=11)
    case.k_cache = case.k_cache.abs() + 1.0
    case.keys = [k.abs() + 1.0 for k in case.keys]
    case.q = -(case.q.abs() + 1.0) * 8.0
    out = _prefill(cpu_ops, case)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), dense_attention(case), atol=1e-4, rtol=1e-4)
