"""The founding use case: Kimi's MoonViT grafted onto a frozen GLM4, trained (align) and served."""

import json

import pytest
import torch
from PIL import Image

from graft.io import weights_sha256
from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.multimodal.front import generate_chats
from graft.spec import GraftSpec
from graft.train.loop import train
from tests.graft.conftest import make_dataset

ASK = [{"role": "user", "content": "<image>\nWhat color?"}]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes on a shared box
    yield
    torch.set_num_threads(before)


def _hf_tokens(model, image):
    from graft.template import encode_chat

    n = model.image_token_count(*image.size)
    ids = torch.tensor([encode_chat(model.tokenizer, ASK, [n], add_generation_prompt=True).input_ids])
    embeds = model.embed(ids, model.image_features([image]))
    out = model.llm.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids),
                             max_new_tokens=5, min_new_tokens=5, do_sample=False, temperature=None,
                             top_p=None, top_k=None, pad_token_id=model.tokenizer.pad_token_id)
    return out[0].tolist()


def test_glm4_with_moonvit_trains_and_serves(tiny_llm_factory, k25_dir, tmp_path):
    from graft.model import GraftedModel

    glm4 = tiny_llm_factory("glm4")
    before = weights_sha256(glm4)
    data = make_dataset(tmp_path / "data", n=6)
    spec = GraftSpec.from_dict({
        "encoder": {"kind": "moonvit", "path": str(k25_dir), "feature_layer": -1},
        "adapter": {"kind": "mlp", "depth": 2, "layer_norm": True, "norm_chunks": 4},
        "llm": {"path": str(glm4)},
        "data": {"train": str(data), "image_root": str(data.parent), "max_length": 128},
        "train": {"stage": "align", "lr": 2e-2, "batch_size": 3, "max_steps": 6, "seed": 0,
                  "log_every": 1, "warmup_ratio": 0.0},
        "output_dir": str(tmp_path / "run")})
    run = train(spec)
    losses = [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert weights_sha256(glm4) == before  # the LLM is never touched

    engine = Engine.from_pretrained(run, EngineConfig(block_size=4, num_kv_blocks=64,
                                                      max_num_batched_tokens=32))
    small, wide = Image.new("RGB", (32, 32), (220, 30, 30)), Image.new("RGB", (90, 40), (30, 40, 220))
    model = GraftedModel.from_run(run)
    assert model.image_token_count(*small.size) != model.image_token_count(*wide.size)
    done = generate_chats(engine, {"small": (ASK, [small]), "wide": (ASK, [wide])}, GREEDY)
    assert done["small"].token_ids == _hf_tokens(model, small)
    assert done["wide"].token_ids == _hf_tokens(model, wide)
