"""The AMX tile path of the C paged prefill (kernels/csrc/paged_prefill_amx.c), taken for bf16
queries over bf16 caches on a CPU with AMX: against fp64 dense attention as close as torch's own
bf16 SDPA gets (the probabilities enter the value product in bf16, as there), against the vector
kernel of a CPU without AMX, over several key chunks, cached prefixes, head sizes, groups wider
than a tile, and independent of the batch and the threads."""

import pytest
import torch
import torch.nn.functional as F

from graft.kernels import cpu_ops, cpu_quant
from tests.kernels.paged_case import dense_attention, make_case

pytestmark = pytest.mark.skipif(
    not cpu_ops.available() or cpu_quant.isa() != "avx512-amx"
    or not cpu_ops._lib().graft_prefill_amx_applies(1, 1, 64),
    reason="no AMX prefill on this machine")


def _prefill(case, threads=2):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return cpu_ops.paged_attention_prefill(case.q, case.k_cache, case.v_cache, case.block_tables,
                                               case.cu_seqlens_q, case.context_lens, case.scale)
    finally:
        torch.set_num_threads(before)


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt())


def _sdpa_bf16(case) -> torch.Tensor:
    """torch's bf16 SDPA (what HF runs) over each sequence's keys: the queries of its chunk."""
    out = torch.zeros(case.q.shape, dtype=torch.bfloat16)
    cu = case.cu_seqlens_q.tolist()
    for i, n in enumerate(case.context_lens.tolist()):
        lo, hi = cu[i], cu[i + 1]
        if hi == lo:
            continue
        group = case.q.shape[1] // case.keys[i].shape[1]
        k, v = (t.repeat_interleave(group, dim=1).transpose(0, 1)[None] for t in (case.keys[i], case.values[i]))
        q = case.q[lo:hi].transpose(0, 1)[None]
        mask = torch.ones(hi - lo, n, dtype=torch.bool).tril(n - (hi - lo))  # a chunk after a prefix
        out[lo:hi] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("block_size,num_kv_heads,group,head_dim",
                         [(16, 3, 3, 64), (32, 2, 6, 128), (16, 1, 200, 64), (8, 2, 1, 32)])
def test_amx_prefill_is_as_close_to_exact_as_torch_bf16_sdpa(block_size, num_kv_heads, group, head_dim):
    # 700 keys: two chunks of scores (512 keys each); 77 queries after a cached prefix; lengths
    # that are no multiple of 32; one query; an empty chunk
    lens, q_lens = [700, 300, 41, 5, 1], [700, 77, 41, 0, 1]
    if group == 200:  # one position per tile of 200 rows
        lens, q_lens = [70, 33], [70, 5]
    case = make_case(lens, q_lens, block_size, num_kv_heads, group, head_dim, dtype=torch.bfloat16, seed=3)
    exact = dense_attention(case)
    got = _prefill(case)
    with cpu_quant.isa_capped("avx512-vnni"):
        vector = _prefill(case)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), exact, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got, vector, atol=2e-2, rtol=2e-2)
    # the error of rounding the exact result to bf16 alone, and of torch's bf16 SDPA: the AMX
    # path is within 10% of torch's (a masked or lost key would be far off)
    rounding, sdpa = _rms(exact.bfloat16().double() - exact), _rms(_sdpa_bf16(case).double() - exact)
    assert rounding <= _rms(got.double() - exact) <= 1.1 * sdpa


def test_amx_prefill_is_the_same_alone_in_a_batch_and_on_any_thread_count():
    lens, q_lens = [600, 64, 65, 129, 7], [600, 30, 65, 1, 7]
    case = make_case(lens, q_lens, 16, 2, 3, 64, dtype=torch.bfloat16, seed=5)
    cu, outs = case.cu_seqlens_q.tolist(), []
    for threads in (1, 2):
        batch = _prefill(case, threads)
        for i in range(len(lens)):
            alone = cpu_ops.paged_attention_prefill(
                case.q[cu[i]:cu[i + 1]], case.k_cache, case.v_cache, case.block_tables[i:i + 1],
                torch.tensor([0, q_lens[i]], dtype=torch.int32), case.context_lens[i:i + 1], case.scale)
            assert torch.equal(batch[cu[i]:cu[i + 1]], alone), f"sequence {i}, {threads} threads"
        outs.append(batch)
    assert torch.equal(outs[0], outs[1])


def test_amx_prefill_keeps_scores_far_below_zero_over_chunks():
    """Scores near -2000 in every chunk: each chunk's softmax shifts by its own largest score and
    the chunks combine (a shift by 0 or a lost rescale would give NaN or zeros)."""
    case = make_case([1100, 70], [1100, 3], 16, 2, 3, 64, dtype=torch.bfloat16, seed=11)
    case.k_cache = case.k_cache.abs() + 1.0
    case.keys = [k.abs() + 1.0 for k in case.keys]
    case.q = (-(case.q.float().abs() + 1.0) * 8.0).bfloat16()
    got = _prefill(case)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), dense_attention(case), atol=2e-2, rtol=2e-2)


def test_amx_prefill_runs_only_for_bf16_over_bf16_whole_tile_heads():
    lib = cpu_ops._lib()
    assert lib.graft_prefill_amx_applies(1, 1, 64) and lib.graft_prefill_amx_applies(1, 1, 256)
    assert not lib.graft_prefill_amx_applies(0, 1, 64)  # fp32 q over a bf16 cache
    assert not lib.graft_prefill_amx_applies(1, 1, 80)  # not whole 32-dim tile rows
    assert not lib.graft_prefill_amx_applies(1, 1, 288)
    with cpu_quant.isa_capped("avx512-vnni"):  # GRAFT_CPU_ISA below AMX
        assert not lib.graft_prefill_amx_applies(1, 1, 64)
