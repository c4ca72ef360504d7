"""Session fixtures: tiny random checkpoints, run dirs and Kimi donors built offline (no hub)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# engines in tests run the C kernels at every row count: which path a timing would pick must
# not depend on the machine's speed (tests/kernels/test_linear_dispatch.py covers the choice)
os.environ.setdefault("GRAFT_LINEAR_DISPATCH", "c")

import pytest

from tests.kimi_donors import build_k25_model, save_hf_names, save_k25, save_kimi_vl
from tests.tiny_llm import LLM_FAMILIES, build_llm
from tests.vision_fixtures import *  # noqa: F401,F403


@pytest.fixture(scope="session")
def tiny_llm_factory(tmp_path_factory):
    """family -> path of a tiny random LLM dir (built once per session)."""
    made = {}

    def make(family: str = "llama"):
        if family not in made:
            made[family] = build_llm(tmp_path_factory.mktemp(f"llm_{family}"), family)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_llm_factory):
    return tiny_llm_factory("llama")


@pytest.fixture(scope="session", params=LLM_FAMILIES)
def tiny_llm_any(request, tiny_llm_factory):
    return tiny_llm_factory(request.param)


def _write_run(root, name, enc_cfg, llm_dir, seed, record_sha=True):
    """A run dir written the way `graft train` writes one: graft.yaml (+ llm.sha256) and
    adapter.safetensors/adapter.json (MLP projector)."""
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
    llm = {"path": str(llm_dir)}
    if record_sha:
        llm["sha256"] = weights_sha256(llm_dir)
    GraftSpec.from_dict({"encoder": enc_cfg.to_dict(), "adapter": proj.config.to_dict(),
                         "llm": llm}).save(run / "graft.yaml")
    return run


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory, tiny_llama, tiny_encoder_config):
    """SigLIP 32px -> 16 tokens, MLP projector, tiny Llama (no llm.sha256 recorded)."""
    return _write_run(tmp_path_factory.mktemp("run"), "run", tiny_encoder_config("siglip"),
                      tiny_llama, 0, record_sha=False)


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
    from tests.graft.conftest import make_dataset

    root = tmp_path_factory.mktemp("qwen_graft")
    data = make_dataset(root / "data", n=4)
    spec = GraftSpec.from_dict({
        "encoder": tiny_encoder_config("siglip").to_dict(), "adapter": {"kind": "mlp", "depth": 2},
        "llm": {"path": str(tiny_llm_factory("qwen2"))},
        "data": {"train": str(data), "image_root": str(data.parent), "max_length": 256},
        "train": {"stage": "align", "batch_size": 2, "max_steps": 1, "warmup_ratio": 0.0},
        "output_dir": str(root / "run")})
    return train(spec)


# Tiny Kimi donors (MoonViT + projector checkpoints), built once per session.
@pytest.fixture(scope="session")
def kimi_model():
    return build_k25_model()


@pytest.fixture(scope="session")
def k25_dir(kimi_model, tmp_path_factory):
    return save_k25(kimi_model, tmp_path_factory.mktemp("kimi_k25"))


@pytest.fixture(scope="session")
def hf_names_dir(kimi_model, tmp_path_factory):
    return save_hf_names(kimi_model, tmp_path_factory.mktemp("kimi_k25_hf_names"))


@pytest.fixture(scope="session")
def kimi_vl_dir(k25_dir, tmp_path_factory):
    return save_kimi_vl(k25_dir, tmp_path_factory.mktemp("kimi_vl"))
