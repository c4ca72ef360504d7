"""A KV cache of another dtype than the activations (bf16, int8 with a scale per token and
head): greedy tokens equal HF transformers whose cache holds the same rounded values, the
C decode reads the pool in place, the pool holds more blocks for the same bytes."""

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from graft.errors import GraftConfigError
from graft.kernels import cpu_ops, reference
from graft.serving import Engine, EngineConfig, SamplingParams
from tests.serving.conftest import make_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
LENGTHS = (5, 17, 40, 1, 16)


def _round_trip(x: torch.Tensor, kv_dtype: str) -> torch.Tensor:
    """What the engine's cache gives back for HF's [B, H, T, D] states."""
    if kv_dtype == "bfloat16":
        return x.to(torch.bfloat16).float()
    rows = x.transpose(1, 2)  # [B, T, H, D]: a scale per token and head
    q, scale = reference.quantize_kv(rows.reshape(-1, *rows.shape[2:]))
    back = reference.dequantize_kv(q, scale).view_as(rows)
    return back.transpose(1, 2).to(x.dtype)


class RoundTripCache(DynamicCache):
    """HF's cache, holding K/V as the engine's cache of kv_dtype holds them."""

    def __init__(self, kv_dtype: str, **kwargs):
        super().__init__(**kwargs)
        self.kv_dtype = kv_dtype

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(_round_trip(key_states, self.kv_dtype),
                              _round_trip(value_states, self.kv_dtype), layer_idx, *args, **kwargs)


def _hf_greedy(model, prompt, max_new, kv_dtype):
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, cache=RoundTripCache(kv_dtype))
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("kv_dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("kernels", ["auto", "reference"])  # auto: the C decode reads the pool
def test_greedy_tokens_equal_hf_with_the_same_cache_values(tiny_llm_any, kv_dtype, kernels,
                                                           monkeypatch):
    monkeypatch.setenv("GRAFT_KERNELS", kernels)
    engine = Engine.from_pretrained(tiny_llm_any, EngineConfig(num_kv_blocks=64,
                                                               kv_cache_dtype=kv_dtype))
    assert engine.runner.kv_cache.dtype == getattr(torch, kv_dtype)
    model = AutoModelForCausalLM.from_pretrained(tiny_llm_any, dtype=torch.float32).eval()
    prompts = make_prompts(LENGTHS, seed=3)
    free0 = engine.block_manager.num_free_blocks
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=GREEDY)  # one mixed batch
    for i, (p, o) in enumerate(zip(prompts, outs)):
        assert o.token_ids == _hf_greedy(model, p, GREEDY.max_tokens, kv_dtype), f"prompt {i}"
    assert engine.block_manager.num_free_blocks == free0


def test_int8_cache_with_prefix_caching_and_chunked_prefill(tiny_llama):
    cfg = dict(kv_cache_dtype="int8", max_num_batched_tokens=7, num_kv_blocks=64)
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(**cfg))
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    shared = make_prompts([37], seed=1)[0]
    first = engine.generate(prompt_token_ids=[shared + [5]], sampling_params=GREEDY)[0]
    again = engine.generate(prompt_token_ids=[shared + [9, 4]], sampling_params=GREEDY)[0]
    assert again.num_cached_tokens >= 32  # int8 blocks (and their scales) reused
    assert first.token_ids == _hf_greedy(model, shared + [5], GREEDY.max_tokens, "int8")
    assert again.token_ids == _hf_greedy(model, shared + [9, 4], GREEDY.max_tokens, "int8")


def test_the_reference_cache_really_rounds(tiny_llama):
    """The HF side of the parity tests sees rounded K/V (else they would prove nothing)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = torch.tensor([make_prompts([24], seed=5)[0]])
    with torch.no_grad():
        plain = model(ids, past_key_values=DynamicCache()).logits
        for kv_dtype in ("bfloat16", "int8"):
            rounded = model(ids, past_key_values=RoundTripCache(kv_dtype)).logits
            assert not torch.equal(plain, rounded)
            torch.testing.assert_close(plain, rounded, rtol=0, atol=0.05)


def test_the_pool_holds_more_blocks_for_the_same_bytes(tiny_llama):
    sizes = {d: Engine.from_pretrained(tiny_llama, EngineConfig(
        kv_cache_memory=1 << 20, kv_cache_dtype=d)).runner for d in ("float32", "bfloat16", "int8")}
    f32, bf16, i8 = (sizes[d].num_blocks for d in ("float32", "bfloat16", "int8"))
    head_dim = sizes["int8"].model.head_dim
    assert bf16 == 2 * f32 or bf16 == 2 * f32 + 1
    assert i8 == (1 << 20) // sizes["int8"].bytes_per_block()
    assert sizes["int8"].bytes_per_block() * 4 * head_dim == \
        sizes["float32"].bytes_per_block() * (head_dim + 4)  # 1 byte per value + 4 per scale


@pytest.mark.skipif(not cpu_ops.available(), reason="the C kernels could not be built")
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.int8])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("d", [32, 64, 128])  # 64/128: the vectorised kernels; 32: the general loop
def test_c_decode_reads_bf16_and_int8_caches_like_the_reference(cache_dtype, threads, d):
    torch.manual_seed(0)
    nb, bs, hkv, hq = 24, 4, 2, 6
    kc, vc = (torch.zeros(nb, bs, hkv, d, dtype=cache_dtype) for _ in range(2))
    ks = vs = None
    if cache_dtype == torch.int8:
        ks, vs = torch.zeros(nb, bs, hkv), torch.zeros(nb, bs, hkv)
    k, v = torch.randn(80, hkv, d), torch.randn(80, hkv, d)
    reference.store_kv(k, v, kc, vc, torch.randperm(nb * bs)[:80], ks, vs)
    tables = torch.randint(0, nb, (3, 10), dtype=torch.int32)
    lens = torch.tensor([7, 0, 37], dtype=torch.int32)  # ragged (16-token tiles + tails), one empty
    q = torch.randn(3, hq, d)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = cpu_ops.paged_attention_decode(q, kc, vc, tables, lens, 0.125, ks, vs)
    finally:
        torch.set_num_threads(old)
    want = reference.paged_attention_decode(q, kc, vc, tables, lens, 0.125, ks, vs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got[1].abs().max() == 0  # an empty context attends to nothing


def test_int8_rows_round_trip_within_half_a_step():
    x = torch.randn(9, 3, 32) * torch.logspace(-3, 2, 9)[:, None, None]
    q, scale = reference.quantize_kv(x)
    assert q.dtype == torch.int8 and scale.shape == (9, 3)
    err = (reference.dequantize_kv(q, scale) - x).abs()
    assert bool((err <= scale[..., None] / 2 + 1e-6 * x.abs()).all())
    zero_q, zero_s = reference.quantize_kv(torch.zeros(2, 3, 32))  # no division by zero
    assert zero_q.abs().max() == 0 and zero_s.abs().max() == 0


def test_bad_kv_cache_dtype_names_the_field():
    with pytest.raises(GraftConfigError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="fp8")
    with pytest.raises(GraftConfigError, match="on CUDA the KV cache"):
        EngineConfig(device="cuda", kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="needs k_scale"):
        reference.store_kv(torch.zeros(1, 1, 4), torch.zeros(1, 1, 4),
                           torch.zeros(2, 2, 1, 4, dtype=torch.int8),
                           torch.zeros(2, 2, 1, 4, dtype=torch.int8), torch.tensor([0]))
