"""The C per-token ops of graft.kernels.cpu_ops (fp32 RMSNorm + residual, rotary, KV store,
silu(gate) * up):
equal to the reference on the strided views the model passes, chosen by dispatch on CPU."""

import pytest
import torch

import graft.kernels as K
from graft.kernels import cpu_ops
from graft.kernels import reference as ref

needs_c = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))


def _qkv(tokens=7, heads=4, kv_heads=2, d=16, seed=0):
    """q, k, v as the model makes them: strided views of one fused projection output."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return (q.reshape(tokens, heads, d), k.reshape(tokens, kv_heads, d),
            v.reshape(tokens, kv_heads, d))


@needs_c
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [1, 5, 300])  # 300 x 576 rows: the multi-threaded branch
def test_rms_norm_with_and_without_residual(rows, threads):
    g = torch.Generator().manual_seed(rows)
    x, res = torch.randn(rows, 576, generator=g) * 3, torch.randn(rows, 576, generator=g)
    w = torch.randn(576, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y, total = cpu_ops.rms_norm(x, w, 1e-5, res)
        plain = cpu_ops.rms_norm(x, w, 1e-6)
    finally:
        torch.set_num_threads(before)
    y_ref, total_ref = ref.rms_norm(x, w, 1e-5, res)
    assert torch.equal(total, total_ref)  # the residual sum is one exact add
    # the mean of squares is summed in another order than torch's: within a few ulp
    torch.testing.assert_close(y, y_ref, atol=0, rtol=1e-6)
    torch.testing.assert_close(plain, ref.rms_norm(x, w, 1e-6), atol=0, rtol=1e-6)


@needs_c
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rot_frac", [1.0, 0.5])  # full and partial (GLM4) rotary
def test_rotary_is_bitwise_the_reference(interleaved, rot_frac):
    q, k, _ = _qkv(d=16)
    half = int(16 * rot_frac) // 2
    g = torch.Generator().manual_seed(1)
    cos, sin = torch.randn(7, half, generator=g), torch.randn(7, half, generator=g)
    for x in (q, k, q[:1]):  # strided views, and a single token
        out = cpu_ops.apply_rotary(x, cos[:x.shape[0]], sin[:x.shape[0]], interleaved)
        assert out.is_contiguous()
        assert torch.equal(out, ref.apply_rotary(x, cos[:x.shape[0]], sin[:x.shape[0]], interleaved))


@needs_c
def test_store_kv_matches_reference_and_rejects_bad_slots():
    _, k, v = _qkv()
    caches = [torch.zeros(3, 4, 2, 16) for _ in range(4)]
    slots = torch.tensor([5, -1, 0, 11, 2, -1, 7])  # -1: padding rows are skipped
    cpu_ops.store_kv(k, v, caches[0], caches[1], slots)
    ref.store_kv(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    before = caches[0].clone()
    cpu_ops.store_kv(k[:0], v[:0], caches[0], caches[1], slots[:0])  # an empty batch writes nothing
    assert torch.equal(caches[0], before)
    with pytest.raises(ValueError, match="slot 12 but the cache has only 12 slots"):
        cpu_ops.store_kv(k, v, caches[0], caches[1], torch.tensor([0, 1, 2, 3, 4, 12, 6]))
    assert torch.equal(caches[0], before)  # nothing written on a bad mapping


@needs_c
@pytest.mark.parametrize("rows", [1, 7, 64])  # 64 x 1536: the multi-threaded branch
def test_silu_mul_matches_torch(rows):
    g = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 1536 + 8, generator=g)[:, 8:] * 6  # strided rows
    gate_up[0, :6] = torch.tensor([-200.0, 200.0, 0.0, -0.0, 1e-30, -88.5])  # extremes and zeros
    out = cpu_ops.silu_mul(gate_up, 1536)
    want = torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
    # another exp than torch's: within a few ulp; below x = -87 it flushes exp(x) to zero, so
    # silu(-88.5) is -0 instead of about -3e-37
    torch.testing.assert_close(out, want, atol=1e-35, rtol=5e-7)
    assert torch.equal(out[0, :4], want[0, :4])
    with pytest.raises(ValueError, match="expected 2 \\* intermediate = 3000"):
        K.silu_mul(gate_up, 1500)


@needs_c
def test_dispatch_uses_c_for_fp32_cpu_rows_only(monkeypatch):
    calls = []
    for name in ("rms_norm", "apply_rotary", "store_kv", "silu_mul"):
        fn = getattr(cpu_ops, name)
        monkeypatch.setattr(cpu_ops, name, lambda *a, _fn=fn, _n=name, **kw: calls.append(_n) or _fn(*a, **kw))
    q, k, v = _qkv()
    cos = sin = torch.ones(7, 8)
    x = torch.randn(7, 64)
    monkeypatch.setenv("GRAFT_KERNELS", "auto")
    K.rms_norm(x, torch.ones(64), 1e-6, x)
    K.apply_rotary(q, cos, sin)
    K.store_kv(k, v, torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, 2, 16), torch.arange(7))
    K.silu_mul(torch.randn(7, 32), 16)
    assert calls == ["rms_norm", "apply_rotary", "store_kv", "silu_mul"]
    calls.clear()
    K.rms_norm(x.double(), torch.ones(64, dtype=torch.float64), 1e-6)  # fp64: reference
    K.rms_norm(x.requires_grad_(), torch.ones(64), 1e-6)  # autograd: reference
    heads_apart = torch.randn(4, 7, 16).transpose(0, 1)  # [7, 4, 16], heads not adjacent in a row
    torch.testing.assert_close(K.apply_rotary(heads_apart, cos, sin),
                               ref.apply_rotary(heads_apart.contiguous(), cos, sin))
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    K.apply_rotary(q, cos, sin)
    assert calls == []
