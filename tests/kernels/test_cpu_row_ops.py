"""The C per-token ops of graft.kernels.cpu_ops (RMSNorm + residual, rotary, KV store,
silu(gate) * up) in fp32 and bf16: equal to the reference bit for bit on the strided views the
model passes, at 1 and 2 threads, and chosen by dispatch for fp32/bf16 CPU rows; a bf16 engine
gives the reference's logprobs with them."""

import contextlib

import pytest
import torch

import graft.kernels as K
from graft.kernels import cpu_ops
from graft.kernels import reference as ref

needs_c = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
DTYPES = [torch.float32, torch.bfloat16]


@contextlib.contextmanager
def _threads(n):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _qkv(tokens=7, heads=4, kv_heads=2, d=16, seed=0, dtype=torch.float32):
    """q, k, v as the model makes them: strided views of one fused projection output."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=g).to(dtype)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return (q.reshape(tokens, heads, d), k.reshape(tokens, kv_heads, d),
            v.reshape(tokens, kv_heads, d))


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows,d", [(1, 576), (5, 576), (300, 576), (3, 5), (4, 100), (2, 4096)])
def test_rms_norm_with_and_without_residual(rows, d, threads, dtype):
    # 300 x 576: the multi-threaded branch; d 5 (torch's scalar sum), 100 (a tail after the
    # 8-wide vectors) and 4096 (the cascade's second level) cover each step of the sum order
    g = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, d + 3, generator=g) * 3).to(dtype)[:, 3:]  # strided rows
    res = torch.randn(rows, d, generator=g).to(dtype)
    for w in (torch.randn(d, generator=g).to(w_dtype) for w_dtype in DTYPES):  # any of the two
        with _threads(threads):
            y, total = cpu_ops.rms_norm(x, w, 1e-5, res)
            plain = cpu_ops.rms_norm(x, w, 1e-6)
        y_ref, total_ref = ref.rms_norm(x, w, 1e-5, res)
        assert y.dtype == total.dtype == dtype
        assert torch.equal(total, total_ref)  # the residual sum is one add, rounded like torch's
        # the mean of squares is summed in torch's order: the same bits, not a few ulp apart
        assert torch.equal(y, y_ref)
        assert torch.equal(plain, ref.rms_norm(x, w, 1e-6))


@needs_c
def test_bf16_residual_sums_round_like_torch_at_ties_overflow_and_denormals():
    """x + residual in bf16, 16 values at a time (vcvtneps2bf16 where the CPU has it, which
    reads denormals as zero: such vectors round in integer steps): ties to even, sums past the
    largest bf16, signed zeros and denormal sums as torch rounds them; NaN stays NaN."""
    big = torch.finfo(torch.bfloat16).max
    pairs = [(1.0, 2.0 ** -8), (1.0 + 2.0 ** -7, 2.0 ** -8), (big, big), (-big, -big), (-0.0, -0.0),
             (-0.0, 0.0), (3.0, -3.0), (2.0 ** -126, -(2.0 ** -127)), (2.0 ** -130, 2.0 ** -131),
             (-(2.0 ** -133), 0.0), (float("inf"), 1.0), (float("nan"), 1.0), (1e-20, 1.0),
             (0.1, 0.2), (-7.5, 0.03125), (65504.0, 17.0)]
    x = torch.tensor([a for a, _ in pairs]).bfloat16()
    r = torch.tensor([b for _, b in pairs]).bfloat16()
    normal = x.float().abs() + r.float().abs() >= 2.0 ** -125
    for lanes in (normal, torch.ones_like(normal)):  # vectors without and with denormal lanes
        xs, rs = x[lanes].repeat(4)[:32], r[lanes].repeat(4)[:32]  # two 16-lane vectors
        _, total = cpu_ops.rms_norm(xs[None], torch.ones(32).bfloat16(), 1e-6, rs[None])
        want = xs + rs
        nan = want.isnan()
        assert torch.equal(total[0][~nan].view(torch.int16), want[~nan].view(torch.int16))
        assert bool(total[0][nan].isnan().all())


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
def test_per_head_rms_norm_of_q_and_k_views(dtype):
    """Qwen3's q/k norms: [T, H, D] strided views of the fused qkv, and a single token."""
    q, k, _ = _qkv(dtype=dtype)
    w = torch.randn(16).to(dtype)
    for x in (q, k, q[:1], q.contiguous()):
        out = cpu_ops.rms_norm(x, w, 1e-6)
        assert out.shape == x.shape and out.is_contiguous()
        assert torch.equal(out, ref.rms_norm(x, w, 1e-6))


@needs_c
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_updates_the_residual_in_place(dtype):
    """graft_rms_norm with sum_out == residual, as decode_step_cpu.c keeps its residual stream."""
    g = torch.Generator().manual_seed(3)
    x, res, w = (torch.randn(5, 576, generator=g).to(dtype) for _ in range(3))
    y_ref, total_ref = ref.rms_norm(x, w[0], 1e-5, res)
    out, code = torch.empty_like(x), cpu_ops._ROW_DTYPES[dtype]
    cpu_ops._lib().graft_rms_norm(x.data_ptr(), 576, res.data_ptr(), 576, w[0].data_ptr(), out.data_ptr(),
                                  res.data_ptr(), 5, 576, 1e-5, code, code, 1)
    assert torch.equal(out, y_ref) and torch.equal(res, total_ref)


@needs_c
@pytest.mark.parametrize("dtype,cos_dtype", [(a, b) for a in DTYPES for b in DTYPES])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rot_frac", [1.0, 0.5])  # full and partial (GLM4) rotary
def test_rotary_is_bitwise_the_reference(interleaved, rot_frac, dtype, cos_dtype):
    # bf16 x and cos: every product and the sum round to bf16 like the reference's bf16 ops;
    # fp32 in either (vision encoders upcast cos): fp32 arithmetic, one rounding at the end
    for tokens, threads in ((7, 1), (128, 2)):  # 128 x 8 heads x 64: the multi-threaded branch
        q, k, _ = _qkv(tokens=tokens, heads=8, d=64, dtype=dtype)
        half = int(64 * rot_frac) // 2
        g = torch.Generator().manual_seed(1)
        cos = torch.randn(tokens, half, generator=g).to(cos_dtype)
        sin = torch.randn(tokens, half, generator=g).to(cos_dtype)
        for x in (q, k, q[:1]):  # strided views, and a single token
            n = x.shape[0]
            with _threads(threads):
                out = cpu_ops.apply_rotary(x, cos[:n], sin[:n], interleaved)
            assert out.is_contiguous() and out.dtype == dtype
            assert torch.equal(out, ref.apply_rotary(x, cos[:n], sin[:n], interleaved))


@needs_c
@pytest.mark.parametrize("dtype,cache_dtype", [(a, b) for a in DTYPES for b in DTYPES])
def test_store_kv_matches_reference_and_rejects_bad_slots(dtype, cache_dtype):
    _, k, v = _qkv(dtype=dtype)
    caches = [torch.zeros(3, 4, 2, 16, dtype=cache_dtype) for _ in range(4)]
    slots = torch.tensor([5, -1, 0, 11, 2, -1, 7])  # -1: padding rows are skipped
    cpu_ops.store_kv(k, v, caches[0], caches[1], slots)
    ref.store_kv(k, v, caches[2], caches[3], slots)  # fp32 -> bf16: .to() rounding
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    before = caches[0].clone()
    cpu_ops.store_kv(k[:0], v[:0], caches[0], caches[1], slots[:0])  # an empty batch writes nothing
    assert torch.equal(caches[0], before)
    with pytest.raises(ValueError, match="slot 12 but the cache has only 12 slots"):
        cpu_ops.store_kv(k, v, caches[0], caches[1], torch.tensor([0, 1, 2, 3, 4, 12, 6]))
    assert torch.equal(caches[0], before)  # nothing written on a bad mapping


@needs_c
@pytest.mark.parametrize("rows,threads", [(1, 1), (7, 1), (64, 2)])  # 64 x 1536: multi-threaded
def test_silu_mul_matches_torch(rows, threads):
    g = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 1536 + 8, generator=g)[:, 8:] * 6  # strided rows
    gate_up[0, :6] = torch.tensor([-200.0, 200.0, 0.0, -0.0, 1e-30, -88.5])  # extremes and zeros
    with _threads(threads):
        out = cpu_ops.silu_mul(gate_up, 1536)
        out_bf16 = cpu_ops.silu_mul(gate_up.bfloat16(), 1536)
    want = torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
    # another exp than torch's: within a few ulp; below x = -87 it flushes exp(x) to zero, so
    # silu(-88.5) is -0 instead of about -3e-37
    torch.testing.assert_close(out, want, atol=1e-35, rtol=5e-7)
    assert torch.equal(out[0, :4], want[0, :4])
    # bf16: a few fp32 ulp never moved a bf16 rounding here (see the exhaustive test below)
    want_bf16 = ref.silu_mul(gate_up.bfloat16(), 1536)
    assert out_bf16.dtype == torch.bfloat16
    assert torch.equal(out_bf16[:, 6:], want_bf16[:, 6:]) and torch.equal(out_bf16[1:], want_bf16[1:])
    with pytest.raises(ValueError, match="expected 2 \\* intermediate = 3000"):
        K.silu_mul(gate_up, 1500)


@needs_c
def test_bf16_silu_mul_on_every_bf16_gate():
    """Every finite bf16 gate value (times up = 1, ragged width): the C silu, rounded to bf16,
    is torch's except below -87 where exp_neg flushes to zero (-0 instead of ~-1e-37)."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gate = every[torch.isfinite(every)]
    gate_up = torch.cat([gate, torch.ones_like(gate)])[None]
    out = cpu_ops.silu_mul(gate_up, gate.numel())[0]
    want = ref.silu_mul(gate_up, gate.numel())[0]
    normal = ~gate.isnan() & (gate.float() >= -87.0)
    assert torch.equal(out[normal], want[normal])
    flushed = gate.float() < -87.0
    assert bool((out[flushed] == 0).all()) and float(want[flushed].float().abs().max()) < 1e-36


@needs_c
def test_dispatch_uses_c_for_fp32_and_bf16_cpu_rows_only(monkeypatch):
    calls = []
    for name in ("rms_norm", "apply_rotary", "store_kv", "silu_mul"):
        fn = getattr(cpu_ops, name)
        monkeypatch.setattr(cpu_ops, name, lambda *a, _fn=fn, _n=name, **kw: calls.append(_n) or _fn(*a, **kw))
    monkeypatch.setenv("GRAFT_KERNELS", "auto")
    for dtype in DTYPES:
        q, k, v = _qkv(dtype=dtype)
        cos = sin = torch.ones(7, 8, dtype=dtype)
        x = torch.randn(7, 64).to(dtype)
        K.rms_norm(x, torch.ones(64, dtype=dtype), 1e-6, x)
        K.apply_rotary(q, cos, sin)
        K.store_kv(k, v, torch.zeros(2, 4, 2, 16, dtype=dtype), torch.zeros(2, 4, 2, 16, dtype=dtype),
                   torch.arange(7))
        K.silu_mul(torch.randn(7, 32).to(dtype), 16)
        assert calls == ["rms_norm", "apply_rotary", "store_kv", "silu_mul"]
        calls.clear()
    x, cos = torch.randn(7, 64), torch.ones(7, 8)
    K.rms_norm(x.double(), torch.ones(64, dtype=torch.float64), 1e-6)  # fp64: reference
    K.rms_norm(x.half(), torch.ones(64, dtype=torch.float16), 1e-6)  # fp16: reference
    K.rms_norm(x.bfloat16(), torch.ones(64), 1e-6, x)  # x and residual of two dtypes: reference
    K.rms_norm(x.requires_grad_(), torch.ones(64), 1e-6)  # autograd: reference
    heads_apart = torch.randn(4, 7, 16).transpose(0, 1)  # [7, 4, 16], heads not adjacent in a row
    torch.testing.assert_close(K.apply_rotary(heads_apart, cos, sin),
                               ref.apply_rotary(heads_apart.contiguous(), cos, sin))
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    K.apply_rotary(_qkv()[0], cos, sin)
    assert calls == []


def _bf16_generate(model_dir, monkeypatch, kernels):
    from graft.serving import Engine, EngineConfig, SamplingParams
    from tests.serving.conftest import make_prompts

    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    # the torch linears in both (the default on a CPU with bf16 dot products is the C bf16
    # linears, which sum in another order): this compares the per-token ops
    engine = Engine.from_pretrained(model_dir, EngineConfig(dtype="bfloat16", num_kv_blocks=32,
                                                            quantization="none"))
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=2)
    prompts = make_prompts((5, 17, 33))  # decode alone and beside prefill chunks
    with _threads(1):
        return [(o.token_ids, o.logprobs) for o in engine.generate(prompt_token_ids=prompts,
                                                                  sampling_params=params)]


def _spy(monkeypatch, calls, name, fn):
    """Replace cpu_ops.<name> by fn, recording (name, dtype of the first argument) per call."""
    monkeypatch.setattr(cpu_ops, name, lambda *a, **kw: calls.append((name, a[0].dtype)) or fn(*a, **kw))


# glm4: interleaved partial rotary; qwen3: per-head q/k norms
@needs_c
@pytest.mark.parametrize("family", ["llama", "glm4", "qwen3"])
def test_bf16_engine_on_the_c_kernels_equals_the_reference(tiny_llm_factory, family, monkeypatch):
    model_dir = tiny_llm_factory(family)
    want = _bf16_generate(model_dir, monkeypatch, "reference")
    calls, attention = [], ("paged_attention_decode", "paged_attention_prefill")
    kernels = {name: getattr(cpu_ops, name) for name in attention}
    for name in ("rms_norm", "apply_rotary", "store_kv", "silu_mul"):
        _spy(monkeypatch, calls, name, getattr(cpu_ops, name))
    # dispatch picks the C attention for the bf16 cache; it sums in another order than the
    # reference (on AMX tiles, qwen3's 32-dim heads, the prefill too), so run the reference in
    # its place here: with the C per-token ops alone every bit, and so every logprob, must be
    # the reference's
    for name in attention:
        _spy(monkeypatch, calls, name, getattr(ref, name))
    assert _bf16_generate(model_dir, monkeypatch, "auto") == want
    assert {name for name, dtype in calls if dtype == torch.bfloat16} == {
        "rms_norm", "apply_rotary", "store_kv", "silu_mul", *attention}
    # with the C attention too: the same greedy tokens
    for name in attention:
        monkeypatch.setattr(cpu_ops, name, kernels[name])
    assert [t for t, _ in _bf16_generate(model_dir, monkeypatch, "auto")] == [t for t, _ in want]
