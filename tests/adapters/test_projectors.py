"""Projector shapes, token counts, seeded init, pixel-shuffle layout and bad input."""

import pytest
import torch

from graft.adapters import ADAPTERS, AdapterConfig, build_adapter
from graft.adapters.pixel_shuffle import pixel_shuffle
from graft.errors import GraftConfigError

D_VISION, D_MODEL = 12, 16


def _make(kind, **kw):
    kw.setdefault("num_heads", 2)
    return build_adapter(AdapterConfig(kind=kind, **kw), D_VISION, D_MODEL)


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
@pytest.mark.parametrize("n, grid", [(16, None), (9, (3, 3)), (15, (3, 5)), (1, (1, 1))])
def test_output_rows_match_num_output_tokens(kind, n, grid):
    proj = _make(kind, num_queries=5)
    out = proj(torch.randn(n, D_VISION), grid=grid)
    assert out.shape == (proj.num_output_tokens(n, grid), D_MODEL)
    assert proj.d_vision == D_VISION and proj.d_model == D_MODEL and proj.config.kind == kind


def test_token_count_rules():
    assert _make("mlp").num_output_tokens(37) == 37
    ps = _make("pixel_shuffle")
    assert ps.num_output_tokens(16) == 4
    assert ps.num_output_tokens(15, (3, 5)) == 2 * 3  # odd grid padded up to 4x6
    assert _make("pixel_shuffle", ratio=3).num_output_tokens(49, (7, 7)) == 9
    res = _make("resampler", num_queries=7)
    assert res(torch.randn(5, D_VISION)).shape == res(torch.randn(64, D_VISION)).shape == (7, D_MODEL)


def test_mlp_depth_and_layer_norm():
    mlp = _make("mlp", depth=3, hidden_size=20, layer_norm=True)
    assert [tuple(l.weight.shape) for l in mlp.mlp.linears] == [(20, 12), (20, 20), (16, 20)]
    x = torch.randn(4, D_VISION)
    h = torch.nn.functional.layer_norm(x, (D_VISION,), mlp.norm.weight, mlp.norm.bias)
    for i, lin in enumerate(mlp.mlp.linears):
        h = lin(torch.nn.functional.gelu(h) if i else h)
    assert torch.allclose(mlp(x), h)
    assert len(_make("linear", depth=5).mlp.linears) == 1  # linear ignores depth


def test_chunked_norm_matches_kimi_pre_norm():
    # Kimi normalizes each sub-patch (width d) of a 2x2-merged token (width 4d) on its own.
    proj = build_adapter(AdapterConfig(kind="mlp", layer_norm=True, norm_chunks=4, hidden_size=12), 12, 8)
    assert tuple(proj.norm.weight.shape) == (3,)
    x = torch.randn(5, 12)
    want = torch.nn.functional.layer_norm(x.view(5, 4, 3), (3,), proj.norm.weight, proj.norm.bias).view(5, 12)
    assert torch.equal(proj.norm(x), want)
    with pytest.raises(GraftConfigError, match="norm_chunks=5 must divide the input width 12"):
        build_adapter(AdapterConfig(kind="mlp", layer_norm=True, norm_chunks=5), 12, 8)


def test_pixel_shuffle_layout_is_kimi_merge_order():
    h, w, d, r = 4, 6, 3, 2
    x = torch.arange(h * w * d, dtype=torch.float32).view(h * w, d)
    merged = pixel_shuffle(x, (h, w), r)
    # Kimi-VL patch_merger: view(h/r, r, w/r, r, d).permute(0, 2, 1, 3, 4) -> [tokens, r*r*d]
    kimi = x.view(h // r, r, w // r, r, d).permute(0, 2, 1, 3, 4).reshape(-1, r * r * d)
    assert torch.equal(merged, kimi)
    # Token (0, 0) of the merged grid holds patches (0,0), (0,1), (1,0), (1,1) in that order.
    assert torch.equal(merged[0].view(4, d), x[[0, 1, w, w + 1]])


def test_pixel_shuffle_pads_odd_grids_with_zeros():
    x = torch.randn(15, 2)  # 3 x 5 grid
    merged = pixel_shuffle(x, (3, 5), 2)
    padded = torch.zeros(4, 6, 2)
    padded[:3, :5] = x.view(3, 5, 2)
    assert torch.equal(merged, pixel_shuffle(padded.view(24, 2), (4, 6), 2))


def test_seeded_init_is_deterministic_and_leaves_global_rng_alone():
    for kind in ADAPTERS:
        torch.manual_seed(123)
        before = torch.rand(1)
        torch.manual_seed(123)
        a = _make(kind, seed=7)
        after = torch.rand(1)
        b, c = _make(kind, seed=7), _make(kind, seed=8)
        sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
        assert any(not torch.equal(sa[k], sc[k]) for k in sa)
        assert torch.equal(before, after)


def test_trainable_and_dtype_follow_the_projector():
    proj = _make("pixel_shuffle", layer_norm=True)
    out = proj(torch.randn(16, D_VISION))
    out.sum().backward()
    assert all(p.grad is not None for p in proj.parameters())
    bf16 = _make("resampler").to(torch.bfloat16)
    assert bf16(torch.randn(9, D_VISION)).dtype == torch.bfloat16  # fp32 encoder features are cast


def test_bad_input():
    for kind in ADAPTERS:
        with pytest.raises(GraftConfigError, match=r"d_vision=12 but got features of width 10"):
            _make(kind)(torch.randn(4, 10))
    with pytest.raises(GraftConfigError, match=r"one image's features \[n_tokens, 12\], got \(2, 4, 12\)"):
        _make("mlp")(torch.randn(2, 4, 12))
    with pytest.raises(GraftConfigError, match="15 tokens is not a square, so pass grid"):
        _make("pixel_shuffle")(torch.randn(15, D_VISION))
    with pytest.raises(GraftConfigError, match="grid 3x4 = 12 tokens does not match the 15"):
        _make("pixel_shuffle").num_output_tokens(15, (3, 4))
    with pytest.raises(GraftConfigError, match="num_heads=3 must divide d_model=16"):
        _make("resampler", num_heads=3)
    with pytest.raises(GraftConfigError, match="d_model must be a positive integer"):
        build_adapter(AdapterConfig(), 12, 0)


def test_config_errors():
    assert AdapterConfig.from_dict(AdapterConfig(kind="linear").to_dict()) == AdapterConfig(kind="linear")
    with pytest.raises(GraftConfigError, match="unknown adapter.kind 'qformer'; known kinds: linear, mlp"):
        AdapterConfig.from_dict({"kind": "qformer"})
    with pytest.raises(GraftConfigError, match=r"unknown adapter field\(s\) 'dept'.*allowed: kind, depth"):
        AdapterConfig.from_dict({"dept": 2})
    with pytest.raises(GraftConfigError, match="adapter.depth must be an integer >= 1, got 0"):
        AdapterConfig.from_dict({"depth": 0})
    with pytest.raises(GraftConfigError, match="adapter.layer_norm must be true or false"):
        AdapterConfig.from_dict({"layer_norm": "yes"})
