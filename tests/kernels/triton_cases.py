"""Triton kernels vs the PyTorch references, on CPU under TRITON_INTERPRET=1 (on CUDA if set to 0).

Collected through test_triton_interpret.py, which makes sure TRITON_INTERPRET is set before
triton is first imported (Triton reads it when its own and our kernels are defined).
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from graft.kernels import reference as ref  # noqa: E402
from graft.kernels import triton_ops as tri  # noqa: E402
from tests.kernels.paged_case import make_case  # noqa: E402

if tri.INTERPRET:
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip("graft.kernels.triton_ops was imported without TRITON_INTERPRET=1 and there is no GPU",
                allow_module_level=True)

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float16: dict(atol=2e-3, rtol=2e-3)}
# (block_size, num_kv_heads, group, head_dim): block sizes 16/32, head_dims 64/72/128, GQA 1-8
GEOMETRIES = [(16, 2, 1, 64), (32, 1, 4, 72), (16, 1, 8, 128), (32, 2, 2, 64)]


def _on_device(case):
    for name in ("q", "k_cache", "v_cache", "block_tables", "context_lens", "cu_seqlens_q"):
        setattr(case, name, getattr(case, name).to(DEVICE))
    return case


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_decode_matches_reference(geometry, dtype):
    block_size, kv_heads, group, head_dim = geometry
    # contexts not a multiple of the block size, an empty one, a single token; 0-filled unused entries
    case = _on_device(make_case([37, 0, 1, 70], [1, 1, 1, 1], block_size, kv_heads, group, head_dim,
                                dtype=dtype, unused_fill=0))
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    out = tri.paged_attention_decode(*args)
    torch.testing.assert_close(out, ref.paged_attention_decode(*args), **TOL[dtype])
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("partition_size,contexts", [(64, [200, 64, 0, 65, 3]), (512, [600])])
def test_split_kv_decode_matches_reference(partition_size, contexts):
    case = _on_device(make_case(contexts, [1] * len(contexts), 32, 2, 4, 64))
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    out = tri.paged_attention_decode(*args, partition_size=partition_size)
    torch.testing.assert_close(out, ref.paged_attention_decode(*args), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("geometry", GEOMETRIES[:3])
def test_prefill_matches_reference(geometry, dtype):
    block_size, kv_heads, group, head_dim = geometry
    # chunk after a cached prefix, a whole prompt, an empty chunk, one token after a prefix hit
    case = _on_device(make_case([45, 19, 7, 33], [12, 19, 0, 1], block_size, kv_heads, group, head_dim,
                                dtype=dtype))
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q, case.context_lens,
            case.scale)
    out = tri.paged_attention_prefill(*args, block_m=16)
    torch.testing.assert_close(out, ref.paged_attention_prefill(*args), **TOL[dtype])


def test_prefill_default_tile_and_empty_batch():
    case = _on_device(make_case([70, 5], [70, 5], 16, 2, 2, 64))
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q, case.context_lens,
            case.scale)
    torch.testing.assert_close(tri.paged_attention_prefill(*args), ref.paged_attention_prefill(*args),
                               **TOL[torch.float32])
    empty = tri.paged_attention_prefill(case.q[:0], *args[1:3], case.block_tables[:1],
                                        torch.zeros(2, dtype=torch.int32, device=DEVICE),
                                        case.context_lens[:1], case.scale)
    assert empty.shape == (0, 4, 64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_store_kv_matches_reference(dtype):
    k_cache = torch.zeros(4, 16, 3, 72, dtype=dtype, device=DEVICE)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(5, 3, 72, device=DEVICE).to(dtype)
    v = torch.randn(5, 3, 72, device=DEVICE).to(dtype)
    slots = torch.tensor([17, -1, 0, 63, -1], device=DEVICE)
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    ref.store_kv(k, v, expect_k, expect_v, slots)
    tri.store_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_matches_reference(dtype):
    x = torch.randn(3, 5, 48, device=DEVICE).to(dtype)  # width not a power of two
    res = torch.randn(3, 5, 48, device=DEVICE).to(dtype)
    w = torch.randn(48, device=DEVICE).to(dtype)
    torch.testing.assert_close(tri.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), **TOL[dtype])
    y, new_res = tri.rms_norm(x, w, 1e-6, residual=res)
    y_ref, new_res_ref = ref.rms_norm(x, w, 1e-6, residual=res)
    assert torch.equal(new_res, new_res_ref)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype,head_dim,rot", [(torch.float32, 64, 64), (torch.float16, 72, 32),
                                                (torch.float32, 128, 64)])
def test_rotary_matches_reference(interleaved, dtype, head_dim, rot):
    x = torch.randn(7, 3, head_dim, device=DEVICE).to(dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2, device=DEVICE).float() / rot))
    cos, sin = ref.rope_cos_sin(torch.arange(7, device=DEVICE) * 3, inv_freq)
    out = tri.apply_rotary(x, cos, sin, interleaved=interleaved)
    torch.testing.assert_close(out, ref.apply_rotary(x, cos, sin, interleaved=interleaved), **TOL[dtype])
    assert torch.equal(out[..., rot:], x[..., rot:])


def test_bad_input_is_rejected_before_launch():
    case = _on_device(make_case([5], [1], 16, 2, 2, 64))
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        tri.paged_attention_decode(case.q[:, :3], case.k_cache, case.v_cache, case.block_tables,
                                   case.context_lens, case.scale)
    with pytest.raises(ValueError, match="slot_mapping"):
        k = case.keys[0].to(DEVICE)
        tri.store_kv(k, k, case.k_cache, case.v_cache, torch.tensor([0, 1], device=DEVICE))


def test_half_precision_dot_path(monkeypatch):
    # on GPU fp16/bf16 tiles go to tl.dot as they are (P cast to V's dtype); run that path here in fp16
    from graft.kernels import paged_attention

    monkeypatch.setattr(paged_attention, "_dot_f32", lambda t: t.dtype == torch.float32)
    case = _on_device(make_case([37, 20, 5, 1], [9, 20, 0, 1], 16, 2, 4, 72, dtype=torch.float16))
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q, case.context_lens,
            case.scale)
    torch.testing.assert_close(tri.paged_attention_prefill(*args, block_m=16), ref.paged_attention_prefill(*args),
                               atol=3e-3, rtol=3e-3)
    last = case.cu_seqlens_q[1:] - 1  # decode of each sequence's last token
    dec = (case.q[last.long()], case.k_cache, case.v_cache, case.block_tables, case.context_lens, case.scale)
    torch.testing.assert_close(tri.paged_attention_decode(*dec, partition_size=64),
                               ref.paged_attention_decode(*dec), atol=3e-3, rtol=3e-3)


def test_bench_runs_end_to_end_on_tiny_shapes(monkeypatch):
    from graft.benchmarks import kernels as bench

    monkeypatch.setattr(bench, "DECODE_SWEEP", [dict(tile_n=32, num_warps=8, partition_size=32)])
    monkeypatch.setattr(bench, "PREFILL_SWEEP", [dict(block_m=16, tile_n=32, num_warps=8)])
    cfg = bench.BenchConfig(batch=2, context=40, num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                            dtype="float32", prefill_seqs=2, prefill_len=20, copy_mib=1, iters=1, sweep=True)
    res = bench.run_benchmarks(cfg, torch.device(DEVICE), tri)
    assert res["decode"]["max_abs_diff_vs_sdpa"] < 1e-4 and res["prefill"]["max_abs_diff_vs_sdpa"] < 1e-4
    assert res["decode"]["gb_per_s"] > 0 and res["prefill"]["tflop_per_s"] > 0
    assert len(res["decode"]["sweep"]) == 1 and res["prefill"]["sweep"][0]["tflop_per_s"] > 0


def test_launch_settings_do_not_change_results():
    case = _on_device(make_case([45, 19, 7, 33], [12, 19, 0, 1], 16, 2, 4, 72))
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.cu_seqlens_q, case.context_lens,
            case.scale)
    expect = ref.paged_attention_prefill(*args)
    got = tri.paged_attention_prefill(*args, block_m=32, tile_n=16, max_q_len=19)
    torch.testing.assert_close(got, expect, **TOL[torch.float32])
    last = case.cu_seqlens_q[1:] - 1
    dec = (case.q[last.long()], *args[1:4], case.context_lens, case.scale)
    torch.testing.assert_close(tri.paged_attention_decode(*dec, partition_size=32, tile_n=16, max_context_len=45),
                               ref.paged_attention_decode(*dec), **TOL[torch.float32])
    with pytest.raises(ValueError, match="partition_size"):
        tri.paged_attention_decode(*dec, partition_size=48, tile_n=32)


def _moe_case(dtype, counts=(3, 0, 17, 1, 40), n=40, k=72, seed=0):
    """x rows grouped by expert (one expert without rows, whose weights are NaN: never read)."""
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(sum(counts), k, generator=gen).to(dtype)
    w = torch.randn(len(counts), n, k, generator=gen).to(dtype)
    w[[e for e, c in enumerate(counts) if c == 0]] = float("nan")
    return x.to(DEVICE), w.to(DEVICE), offsets.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_moe_grouped_gemm_matches_reference(dtype):
    from graft.kernels import triton_moe

    x, w, offsets = _moe_case(dtype)
    got = triton_moe.moe_grouped_gemm(x, w, offsets)
    want = ref.moe_grouped_gemm(x, w, offsets)
    assert got.dtype == dtype and not got.isnan().any()
    # outputs ~8: fp32 within TF32x3 on a GPU, 16-bit within a unit in the last place
    atol, rtol = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 2e-3),
                  torch.bfloat16: (6e-2, 1.6e-2)}[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=rtol)
    with pytest.raises(ValueError, match="expert_offsets"):
        triton_moe.moe_grouped_gemm(x, w, offsets[:-1])


def test_moe_block_on_the_grouped_gemm_equals_its_expert_loop(monkeypatch):
    """The MoE layer's Triton path (stacked experts, two launches) vs its per-expert linears."""
    from graft.serving.models.moe import MoEBlock, TopKRouter

    torch.manual_seed(0)
    block = MoEBlock(32, 48, "silu", TopKRouter(32, 6, 2, "softmax", True)).to(DEVICE)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
    x = torch.randn(9, 32, device=DEVICE)
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    want = block(x)
    monkeypatch.setenv("GRAFT_KERNELS", "triton")
    got = block(x)
    assert block._stacked is not None  # the grouped path ran
    assert block.experts[2].down_proj.weight.data_ptr() == block._stacked[1][2].data_ptr()
    torch.testing.assert_close(got, want, **TOL[torch.float32])
