"""A tiny run dir (SigLIP 32px -> 16 tokens, MLP projector, tiny Llama) assembled the way
`graft train` writes one: graft.yaml + adapter.safetensors/adapter.json."""

import pytest



@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory, tiny_llama, tiny_encoder_config):
    import torch

    from graft.adapters import AdapterConfig, build_adapter, save_adapter
    from graft.encoders import build_encoder
    from graft.spec import GraftSpec

    run = tmp_path_factory.mktemp("run")
    enc_cfg = tiny_encoder_config("siglip")
    d_vision = build_encoder(enc_cfg).hidden_size
    proj = build_adapter(AdapterConfig(kind="mlp", depth=2, seed=0), d_vision, 64)
    with torch.no_grad():  # larger outputs so the image visibly steers greedy decoding
        for p in proj.parameters():
            p.mul_(4.0)
    save_adapter(proj, run)
    GraftSpec.from_dict({"encoder": enc_cfg.to_dict(), "adapter": proj.config.to_dict(),
                         "llm": {"path": str(tiny_llama)}}).save(run / "graft.yaml")
    return run
