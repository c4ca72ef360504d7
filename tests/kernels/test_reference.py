"""The PyTorch references against naive dense attention and HF transformers' own functions."""

import pytest
import torch

from graft.kernels import reference as ref
from tests.kernels.paged_case import dense_attention, make_case


@pytest.mark.parametrize("block_size,group,head_dim", [(16, 1, 64), (32, 4, 72), (16, 8, 128)])
def test_prefill_matches_dense(block_size, group, head_dim):
    # chunked prefill (cached prefix), a prefix-cache hit, an empty chunk, a single token
    case = make_case([37, 20, 5, 1], [9, 20, 0, 1], block_size, 2, group, head_dim)
    out = ref.paged_attention_prefill(case.q, case.k_cache, case.v_cache, case.block_tables,
                                      case.cu_seqlens_q, case.context_lens, case.scale)
    torch.testing.assert_close(out.double(), dense_attention(case), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_of_equal_lengths_is_each_sequence_alone(dtype):
    """Sequences of one chunk and context length share one SDPA call (a burst of same-length
    prompts, fresh and after a cached prefix); each gets the bits it gets alone."""
    case = make_case([30, 30, 12, 30, 30, 12, 7], [30, 30, 5, 30, 30, 5, 7], 16, 2, 3, 64, dtype=dtype)
    out = ref.paged_attention_prefill(case.q, case.k_cache, case.v_cache, case.block_tables,
                                      case.cu_seqlens_q, case.context_lens, case.scale)
    torch.testing.assert_close(out.double(), dense_attention(case), atol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               rtol=2e-2 if dtype == torch.bfloat16 else 1e-5)
    starts = case.cu_seqlens_q.tolist()
    for i in range(len(starts) - 1):
        lo, hi = starts[i], starts[i + 1]
        alone = ref.paged_attention_prefill(case.q[lo:hi], case.k_cache, case.v_cache,
                                            case.block_tables[i:i + 1],
                                            torch.tensor([0, hi - lo], dtype=torch.int32),
                                            case.context_lens[i:i + 1], case.scale)
        assert torch.equal(out[lo:hi], alone), f"sequence {i}"


def test_prefill_names_a_block_id_outside_the_cache():
    case = make_case([30, 30], [30, 30], 16, 2, 3, 64)
    tables = case.block_tables.clone()
    tables[1, 1] = case.k_cache.shape[0]  # one past the last block, inside the context
    with pytest.raises(ValueError, match="outside .*fix the block table"):
        ref.paged_attention_prefill(case.q, case.k_cache, case.v_cache, tables,
                                    case.cu_seqlens_q, case.context_lens, case.scale)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_decode_matches_dense_and_zero_context(dtype, tol):
    case = make_case([33, 0, 1, 64], [1, 1, 1, 1], 16, 2, 3, 64, dtype=dtype, unused_fill=0)
    out = ref.paged_attention_decode(case.q, case.k_cache, case.v_cache, case.block_tables,
                                     case.context_lens, case.scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), dense_attention(case), atol=tol, rtol=tol)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_dispatch_env_and_autograd(monkeypatch):
    import graft.kernels as K
    from graft.errors import GraftConfigError

    x = torch.randn(2, 8)
    monkeypatch.setenv("GRAFT_KERNELS", "reference")
    assert K.backend_name(x) == "reference"
    monkeypatch.setenv("GRAFT_KERNELS", "fast")
    with pytest.raises(GraftConfigError, match="GRAFT_KERNELS"):
        K.rms_norm(x, torch.ones(8), 1e-6)
    monkeypatch.setenv("GRAFT_KERNELS", "auto")
    w = torch.ones(8, requires_grad=True)
    x.requires_grad_(True)
    K.rms_norm(x, w, 1e-6).sum().backward()  # CPU/autograd inputs take the reference
    assert x.grad is not None and w.grad is not None


def test_store_kv_skips_minus_one():
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    ref.store_kv(k, v, k_cache, v_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(k_cache[1, 1], k[0]) and torch.equal(v_cache[0, 0], v[2])
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 2  # the -1 row went nowhere


def test_bad_inputs_name_the_field():
    case = make_case([5], [1], 16, 2, 2, 64)
    with pytest.raises(ValueError, match="num_kv_heads"):
        ref.paged_attention_decode(case.q[:, :3], case.k_cache, case.v_cache, case.block_tables,
                                   case.context_lens, case.scale)
    with pytest.raises(ValueError, match="block table"):
        bad = case.block_tables.clone()
        bad[0, 0] = 99
        ref.paged_attention_decode(case.q, case.k_cache, case.v_cache, bad, case.context_lens, case.scale)
    with pytest.raises(ValueError, match="slot"):
        ref.store_kv(case.keys[0], case.values[0], case.k_cache, case.v_cache, torch.tensor([0, 1, 2, 3, 999]))
    with pytest.raises(ValueError, match="context_lens"):
        ref.paged_attention_prefill(case.q.repeat(6, 1, 1), case.k_cache, case.v_cache, case.block_tables,
                                    torch.tensor([0, 6], dtype=torch.int32), case.context_lens, case.scale)
    with pytest.raises(ValueError, match="weight"):
        ref.rms_norm(torch.randn(2, 8), torch.ones(4), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_hf_and_fuses_residual(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    hf = LlamaRMSNorm(24, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(24))
    x, res = torch.randn(5, 24).to(dtype), torch.randn(5, 24).to(dtype)
    with torch.no_grad():
        assert torch.equal(ref.rms_norm(x, hf.weight, 1e-5), hf(x))
        y, new_res = ref.rms_norm(x, hf.weight, 1e-5, residual=res)
        assert torch.equal(new_res, res + x) and torch.equal(y, hf(res + x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_rope_bit_exact(dtype):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32, rope_theta=10000.0)
    rotary = LlamaRotaryEmbedding(cfg)
    pos = torch.tensor([0, 3, 4, 100, 7])
    x = torch.randn(5, 2, 32).to(dtype)
    hf_cos, hf_sin = rotary(x, pos[None])  # [1, T, D] in x.dtype
    cos, sin = ref.rope_cos_sin(pos, rotary.inv_freq)
    assert torch.equal(cos.to(dtype), hf_cos[0, :, :16]) and torch.equal(sin.to(dtype), hf_sin[0, :, :16])
    hf_q, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], hf_cos, hf_sin)
    out = ref.apply_rotary(x, cos.to(dtype), sin.to(dtype))
    assert torch.equal(out, hf_q[0].transpose(0, 1))


def test_glm4_partial_interleaved_rope_bit_exact():
    from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb

    x = torch.randn(6, 3, 32)
    pos = torch.arange(6) * 5
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))  # rotary dim 16 of 32
    cos, sin = ref.rope_cos_sin(pos, inv_freq)  # [T, 8]
    hf_cos, hf_sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
    hf_q, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None], hf_cos, hf_sin)
    out = ref.apply_rotary(x, cos, sin, interleaved=True)
    assert torch.equal(out, hf_q[0].transpose(0, 1))
    assert torch.equal(out[..., 16:], x[..., 16:])


def test_partial_neox_rope_passes_tail_through():
    x = torch.randn(4, 2, 10)
    cos, sin = ref.rope_cos_sin(torch.arange(4), torch.tensor([1.0, 0.1, 0.01]))
    out = ref.apply_rotary(x, cos, sin)
    assert torch.equal(out[..., 6:], x[..., 6:])
    x1, x2 = x[..., :3], x[..., 3:6]
    torch.testing.assert_close(out[..., :3], x1 * cos[:, None] - x2 * sin[:, None])


def test_2d_rope_matches_kimi_k25():
    from transformers.models.kimi_k25.configuration_kimi_k25 import Kimi_K25VisionConfig
    from transformers.models.kimi_k25.modeling_kimi_k25 import (Kimi_K25VisionRotaryEmbedding,
                                                                apply_rotary_pos_emb_vision)
    from transformers.vision_utils import get_vision_position_ids

    cfg = Kimi_K25VisionConfig(hidden_size=64, num_attention_heads=2,
                               rope_parameters={"rope_type": "axial", "rope_theta": 10000.0})
    rotary = Kimi_K25VisionRotaryEmbedding(cfg)
    pos = get_vision_position_ids(torch.tensor([[1, 3, 4]]), spatial_merge_size=1)  # [12, 2] (h, w)
    x = torch.randn(12, 2, 32)
    hf_cos, hf_sin = rotary(x, pos)  # [12, 32]
    cos, sin = ref.rope_cos_sin(pos, (rotary.inv_freq, rotary.inv_freq))
    assert torch.equal(torch.cat((cos, cos), -1), hf_cos) and torch.equal(torch.cat((sin, sin), -1), hf_sin)
    hf_q, _ = apply_rotary_pos_emb_vision(x[None], x[None], hf_cos, hf_sin)
    assert torch.equal(ref.apply_rotary(x, cos, sin), hf_q[0])
