"""save_adapter / load_adapter: exact round trip, atomic files, clear errors."""

import json

import pytest
import torch

from graft.adapters import ADAPTERS, AdapterConfig, build_adapter, load_adapter, save_adapter
from graft.errors import GraftConfigError


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_round_trip_is_exact(kind, tmp_path):
    cfg = AdapterConfig(kind=kind, num_heads=2, num_queries=4, layer_norm=True, depth=3, seed=3)
    proj = build_adapter(cfg, 12, 16)
    with torch.no_grad():  # trained weights, not the seeded init the loader would rebuild anyway
        for p in proj.parameters():
            p.add_(torch.randn_like(p))
    save_adapter(proj, tmp_path / "run")
    assert sorted(f.name for f in (tmp_path / "run").iterdir()) == ["adapter.json", "adapter.safetensors"]
    meta = json.loads((tmp_path / "run" / "adapter.json").read_text())
    assert meta == {"config": cfg.to_dict(), "d_vision": 12, "d_model": 16}
    loaded = load_adapter(tmp_path / "run", d_vision=12, d_model=16)
    assert type(loaded) is type(proj) and loaded.config == cfg
    want, got = proj.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    x = torch.randn(16, 12)
    assert torch.equal(proj(x), loaded(x))


def test_load_errors(tmp_path):
    with pytest.raises(GraftConfigError, match="has no adapter.json"):
        load_adapter(tmp_path)
    proj = build_adapter(AdapterConfig(kind="mlp"), 12, 16)
    save_adapter(proj, tmp_path)
    with pytest.raises(GraftConfigError, match="trained for d_vision=12, but this model needs d_vision=32"):
        load_adapter(tmp_path, d_vision=32)
    meta = json.loads((tmp_path / "adapter.json").read_text())
    meta["d_model"] = 24
    (tmp_path / "adapter.json").write_text(json.dumps(meta))
    with pytest.raises(GraftConfigError, match=r"mlp.linears.1.weight: file \(16, 16\) vs config \(24, 24\)"):
        load_adapter(tmp_path)
    (tmp_path / "adapter.json").write_text("{not json")
    with pytest.raises(GraftConfigError, match="not a valid adapter config"):
        load_adapter(tmp_path)
    (tmp_path / "adapter.json").write_text(json.dumps({"d_vision": 12, "d_model": 16}))
    with pytest.raises(GraftConfigError, match="no 'config' field.*config, d_vision and d_model"):
        load_adapter(tmp_path)
    (tmp_path / "adapter.safetensors").unlink()
    with pytest.raises(GraftConfigError, match="has no adapter.safetensors"):
        load_adapter(tmp_path)


def test_save_overwrites_atomically(tmp_path):
    first = build_adapter(AdapterConfig(kind="linear", seed=1), 4, 8)
    second = build_adapter(AdapterConfig(kind="linear", seed=2), 4, 8)
    save_adapter(first, tmp_path)
    save_adapter(second, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter.json", "adapter.safetensors"]  # no temp left
    assert torch.equal(load_adapter(tmp_path).mlp.linears[0].weight, second.mlp.linears[0].weight)


@pytest.mark.parametrize("kind", sorted(ADAPTERS))
def test_standardize_divides_out_the_stats_and_saves_them(kind, tmp_path):
    cfg = AdapterConfig(kind=kind, num_heads=2, num_queries=4, standardize=True)
    proj = build_adapter(cfg, 12, 16)
    plain = build_adapter(AdapterConfig(kind=kind, num_heads=2, num_queries=4), 12, 16)
    plain.load_state_dict({k: v for k, v in proj.state_dict().items() if not k.startswith("feature_")})
    x = torch.randn(16, 12) * 5 + 3
    torch.testing.assert_close(proj(x), plain(x), rtol=1e-4, atol=1e-4)  # identity up to the eps until the stats are set
    mean, std = torch.linspace(-2, 2, 12), torch.linspace(0.5, 4, 12)
    proj.set_feature_stats(mean, std)
    torch.testing.assert_close(proj(x), plain((x - mean) / (std + 1e-5)))
    assert not any(n.startswith("feature_") for n, _ in proj.named_parameters())  # never trained
    save_adapter(proj, tmp_path)
    loaded = load_adapter(tmp_path)
    assert torch.equal(loaded.feature_mean, mean) and torch.equal(loaded(x), proj(x))
    with pytest.raises(GraftConfigError, match="mean must be 12 finite values"):
        proj.set_feature_stats(torch.zeros(11), std)
    with pytest.raises(GraftConfigError, match="built without adapter.standardize"):
        plain.set_feature_stats(mean, std)
    with pytest.raises(GraftConfigError, match="adapter.standardize must be true or false"):
        AdapterConfig.from_dict({"standardize": "yes"})


def _saved(tmp_path):
    save_adapter(build_adapter(AdapterConfig(kind="mlp"), 12, 16), tmp_path)
    return tmp_path / "adapter.safetensors"


@pytest.mark.parametrize("damage", ["truncated", "empty", "random"])
def test_a_damaged_weights_file_is_a_config_error(tmp_path, damage):
    weights = _saved(tmp_path)
    data = weights.read_bytes()
    weights.write_bytes({"truncated": data[:len(data) // 2], "empty": b"",
                         "random": bytes(range(256)) * 8}[damage])
    with pytest.raises(GraftConfigError, match="adapter.safetensors is not a readable"):
        load_adapter(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, bad):
    from safetensors.torch import load_file, save_file

    weights = _saved(tmp_path)
    state = load_file(str(weights))
    name = sorted(state)[-1]
    state[name][0] = bad
    save_file(state, str(weights))
    with pytest.raises(GraftConfigError, match=f"{name}.*not finite"):
        load_adapter(tmp_path)
