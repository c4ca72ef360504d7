"""GraftedModel: token counts, exact injection, every encoder kind x LLM family, bad input."""

import json

import pytest
import torch
from PIL import Image

from graft.errors import GraftConfigError, GraftDataError
from graft.inject import IMAGE_PLACEHOLDER
from graft.model import GraftedModel
from graft.template import encode_chat
from graft.train.loop import train


@pytest.mark.parametrize("kind", ["siglip", "clip", "timm_vit", "timm_cnn"])
def test_injection_exact_for_each_encoder(make_spec, kind):
    model = GraftedModel.from_spec(make_spec(kind))
    img = Image.new("RGB", (32, 32), (200, 10, 10))
    n = model.image_token_count(*img.size)
    assert n == model.projector.num_output_tokens(model.encoder.num_tokens(32, 32),
                                                  grid=model.encoder.token_grid(32, 32))
    chat = encode_chat(model.tokenizer, [{"role": "user", "content": "Look <image> here"}], [n],
                       add_generation_prompt=True)
    ids = torch.tensor([chat.input_ids])
    feats = model.image_features([img])
    assert feats[0].shape == (n, model.llm.config.hidden_size)
    embeds = model.embed(ids, feats)[0]
    table = model.llm.get_input_embeddings().weight
    is_img = ids[0] == IMAGE_PLACEHOLDER
    assert torch.equal(embeds[is_img], feats[0])
    assert torch.equal(embeds[~is_img], table[ids[0][~is_img]])


@pytest.mark.parametrize("family", ["llama", "qwen2", "glm4"])
def test_families_train_one_step(make_spec, tiny_llm_factory, family):
    run = train(make_spec("siglip", llm=tiny_llm_factory(family), max_steps=1))
    model = GraftedModel.from_run(run)
    answer = model.chat([{"role": "user", "content": "<image>\nWhat color?"}],
                        [Image.new("RGB", (32, 32), (0, 0, 255))], max_new_tokens=4)
    assert isinstance(answer, str)


def test_unknown_encoder_kind(make_spec):
    spec = make_spec()
    spec.encoder = {"kind": "resnet-magic"}
    with pytest.raises(GraftConfigError, match="resnet-magic"):
        GraftedModel.from_spec(spec)


def test_missing_llm_path(make_spec, tmp_path):
    spec = make_spec()
    spec.llm.path = str(tmp_path / "no-llm")
    with pytest.raises(GraftConfigError, match="llm.path"):
        GraftedModel.from_spec(spec)


def test_adapter_dim_mismatch(make_spec, tmp_path, tiny_llm_factory):
    run = train(make_spec(max_steps=1))
    spec = make_spec("timm_cnn")  # 1280-d features; the saved siglip projector takes 32
    with pytest.raises(GraftConfigError, match="encoder gives"):
        GraftedModel.from_spec(spec, adapter_dir=run)


def _bad_data(tmp_path, sample, extra_files=()):
    (tmp_path / "bad").mkdir(exist_ok=True)
    for name, data in extra_files:
        (tmp_path / "bad" / name).write_bytes(data)
    good = {"image": "ok.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat color?"}, {"from": "gpt", "value": "red"}]}
    Image.new("RGB", (32, 32)).save(tmp_path / "bad" / "ok.png")
    path = tmp_path / "bad" / "train.json"
    path.write_text(json.dumps([good, sample]))
    return path


@pytest.mark.parametrize("sample, files, match", [
    ({"image": "ok.png", "conversations": [{"from": "human", "value": "<image><image> hi"},
                                            {"from": "gpt", "value": "x"}]}, (), "marker"),
    ({"images": ["ok.png", "ok.png"], "conversations": [
        {"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}]}, (), "marker"),
    ({"image": "broken.png", "conversations": [
        {"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}]},
     (("broken.png", b"not a png"),), "cannot be decoded"),
    ({"image": "missing.png", "conversations": [
        {"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}]}, (), "does not exist"),
    ({"image": "ok.png", "conversations": [
        {"from": "human", "value": "<image> " + "word " * 400}, {"from": "gpt", "value": "x"}]},
     (), "longer than"),
])
def test_bad_samples_named_or_skipped(make_spec, tmp_path, sample, files, match):
    path = _bad_data(tmp_path, sample, files)
    spec = make_spec(max_steps=1, batch_size=1)
    spec.data.train, spec.data.image_root = str(path), str(path.parent)
    with pytest.raises(GraftDataError, match=f"sample 1: .*{match}"):
        train(spec)
    spec.data.on_bad_sample = "skip"
    run = train(spec)
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["skipped_samples"] == 1 and summary["train_samples"] == 1


def test_adapter_init_seeds_the_projector(make_spec, tmp_path):
    run = train(make_spec(max_steps=1))
    spec = make_spec()
    spec.adapter_init = str(run)
    seeded = GraftedModel.from_spec(spec)
    trained = GraftedModel.from_run(run)
    for (name, a), (_, b) in zip(seeded.projector.state_dict().items(),
                                 trained.projector.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("family", ["llama", "qwen2", "glm4"])
@pytest.mark.parametrize("system_prompt", [None, "You are a careful assistant that looks at pictures."])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_training_loss_matches_hf(make_spec, tiny_llm_factory, family, system_prompt, checkpointing):
    """The training forward runs the head only at labelled positions and, with a system
    prompt, the shared prefix once without autograd; loss and projector gradients must
    equal HF's full-sequence loss."""
    from graft.answer_loss import shared_prefix_length
    from graft.train.batching import Batcher
    from graft.train.inputs import read_inputs

    spec = make_spec("siglip", llm=tiny_llm_factory(family))
    spec.data.system_prompt = system_prompt
    inputs = read_inputs(spec)
    model = GraftedModel.from_spec(spec, image_path=inputs.image_path)
    if checkpointing:  # the prefix must not be shared: recomputation would re-append its cache
        model.llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.llm.train()
    batch = Batcher(spec, model, inputs).collate([0, 1, 2, 3], "cpu")
    # ragged rows, so padding positions are part of what must be ignored
    batch["labels"][1, -3:] = -100
    batch["attention_mask"][1, -2:] = 0
    shared = shared_prefix_length(batch["input_ids"], batch["attention_mask"], batch["labels"])
    assert (shared > 0) == (system_prompt is not None)

    def loss_and_grads(loss_fn):
        model.projector.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.projector.parameters()]

    ours, ours_g = loss_and_grads(lambda: model(**batch).loss)

    def hf_loss():
        embeds = model.embed(batch["input_ids"], model.project(batch["vision_feats"], batch["sizes"]))
        return model.llm(inputs_embeds=embeds, attention_mask=batch["attention_mask"],
                         labels=batch["labels"], use_cache=False).loss

    ref, ref_g = loss_and_grads(hf_loss)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert ours_g[0].abs().sum() > 0


def test_shared_prefix_stops_at_difference_image_label_and_padding():
    from graft.answer_loss import MIN_SHARED_PREFIX, shared_prefix_length

    n = MIN_SHARED_PREFIX + 4
    ids = torch.arange(1, 2 * n + 1).repeat(3, 1)
    mask = torch.ones_like(ids)
    labels = torch.full_like(ids, -100)
    assert shared_prefix_length(ids, mask, labels) == 2 * n - 1  # one position left for the rows
    diff = ids.clone()
    diff[2, n] = 999
    assert shared_prefix_length(diff, mask, labels) == n
    img = ids.clone()
    img[:, n + 1] = IMAGE_PLACEHOLDER
    assert shared_prefix_length(img, mask, labels) == n + 1
    lab = labels.clone()
    lab[1, n + 2] = 5  # predicted from position n + 1, which must stay with the rows
    assert shared_prefix_length(ids, mask, lab) == n + 1
    pad = mask.clone()
    pad[0, n + 3:] = 0
    assert shared_prefix_length(ids, pad, labels) == n + 3
    short = ids.clone()
    short[1, MIN_SHARED_PREFIX - 1] = 999
    assert shared_prefix_length(short, mask, labels) == 0
