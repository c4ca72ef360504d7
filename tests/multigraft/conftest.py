"""Run dirs for several grafts over one tiny LLM, written the way `graft train` writes them
(graft.yaml with llm.sha256 + adapter files), and one trained on another LLM."""

import pytest


def _write_run(root, name, enc_cfg, llm_dir, seed):
    import torch

    from graft.adapters import AdapterConfig, build_adapter, save_adapter
    from graft.encoders import build_encoder
    from graft.io import weights_sha256
    from graft.spec import GraftSpec

    run = root / name
    d_vision = build_encoder(enc_cfg).hidden_size
    proj = build_adapter(AdapterConfig(kind="mlp", depth=2, seed=seed), d_vision, 64)
    with torch.no_grad():  # larger outputs so the image visibly steers greedy decoding
        for p in proj.parameters():
            p.mul_(4.0)
    save_adapter(proj, run)
    GraftSpec.from_dict({"encoder": enc_cfg.to_dict(), "adapter": proj.config.to_dict(),
                         "llm": {"path": str(llm_dir), "sha256": weights_sha256(llm_dir)}}
                        ).save(run / "graft.yaml")
    return run


@pytest.fixture(scope="session")
def graft_runs(tmp_path_factory, tiny_llama, tiny_encoder_config):
    """sig: SigLIP + projector 0; sig2: the same SigLIP + projector 1; clip: CLIP + projector 2."""
    root = tmp_path_factory.mktemp("grafts")
    return {"sig": _write_run(root, "sig", tiny_encoder_config("siglip"), tiny_llama, 0),
            "sig2": _write_run(root, "sig2", tiny_encoder_config("siglip"), tiny_llama, 1),
            "clip": _write_run(root, "clip", tiny_encoder_config("clip"), tiny_llama, 2)}


@pytest.fixture(scope="session")
def qwen_trained_run(tmp_path_factory, tiny_llm_factory, tiny_encoder_config):
    """A run dir `graft.train.train` wrote for a graft on another LLM (tiny Qwen2)."""
    from graft.spec import GraftSpec
    from graft.train import train
    from tests.core.conftest import make_dataset

    root = tmp_path_factory.mktemp("qwen_graft")
    data = make_dataset(root / "data", n=4)
    spec = GraftSpec.from_dict({
        "encoder": tiny_encoder_config("siglip").to_dict(), "adapter": {"kind": "mlp", "depth": 2},
        "llm": {"path": str(tiny_llm_factory("qwen2"))},
        "data": {"train": str(data), "image_root": str(data.parent), "max_length": 256},
        "train": {"stage": "align", "batch_size": 2, "max_steps": 1, "warmup_ratio": 0.0},
        "output_dir": str(root / "run")})
    return train(spec)
