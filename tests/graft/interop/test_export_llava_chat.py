"""The exported LlavaProcessor's chat template renders image messages into graft's own prompt."""

import pytest
import torch

from graft.inject import IMAGE_PLACEHOLDER
from graft.interop.export_llava import export_llava
from graft.serving.http.openai.openai_chat import ChatMessage, to_chat_messages
from tests.graft.interop.test_export_llava import _image
from tests.run_dirs import write_run_dir

IMAGE = {"type": "image"}


def _text(t):
    return {"type": "text", "text": t}


CONVERSATIONS = {
    "image-then-text": [{"role": "user", "content": [IMAGE, _text("What is shown in the image?")]}],
    "text-then-image": [{"role": "user", "content": [_text("Describe this:"), IMAGE]}],
    "two-images": [{"role": "user", "content": [IMAGE, IMAGE, _text("Which digit is shown?")]}],
    "plain-string": [{"role": "user", "content": "<image>\nWhat is shown in the image?"}],
    "image_url-part": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}},
                                                    _text("red or blue?")]}],
    "multi-turn": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": [IMAGE, _text("What colour is the circle?")]},
        {"role": "assistant", "content": [_text("Red.")]},
        {"role": "user", "content": [_text("And this one?"), IMAGE]},
    ],
}


def _graft_messages(messages):
    """The messages graft builds: strings (with <image> markers) as they are, content parts
    through graft's own front end (the chat server's to_chat_messages)."""
    def one(m):
        if not isinstance(m["content"], list):
            return m
        parts = [p if p["type"] != "image" else {"type": "image_url", "image_url": {"url": "x.png"}}
                 for p in m["content"]]
        return to_chat_messages([ChatMessage.model_validate({**m, "content": parts})])[0][0]
    return [one(m) for m in messages]


def _n_images(messages):
    return sum(m["content"].count("<image>") for m in _graft_messages(messages))


@pytest.fixture(scope="module")
def exported(tiny_llm_factory, tiny_clip_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llava_chat")
    run = write_run_dir(tmp / "run", tiny_llm_factory("llama"),
                        {"kind": "clip", "path": str(tiny_clip_dir), "feature_layer": -2},
                        {"kind": "mlp", "depth": 2})
    summary = export_llava(run, tmp / "hf")
    return run, tmp / "hf", summary


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_processor_renders_graft_prompt(exported, name):
    from transformers import AutoProcessor

    from graft.model import GraftedModel
    from graft.template import encode_chat

    run, out, summary = exported
    processor = AutoProcessor.from_pretrained(str(out))
    messages = CONVERSATIONS[name]
    graft_messages = _graft_messages(messages)
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == processor.tokenizer.apply_chat_template(graft_messages, tokenize=False,
                                                           add_generation_prompt=True)
    images = [_image(seed=k) for k in range(_n_images(messages))]
    hf_ids = processor(text=text, images=images or None, return_tensors="pt")["input_ids"][0].tolist()
    model = GraftedModel.from_run(run)
    counts = [model.image_token_count(*im.size) for im in images]
    ours = encode_chat(model.tokenizer, graft_messages, counts, add_generation_prompt=True).input_ids
    assert hf_ids == [summary["image_token_id"] if t == IMAGE_PLACEHOLDER else t for t in ours]


def test_generate_answers_as_graft_chat(exported):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from graft.model import GraftedModel

    run, out, _ = exported
    processor = AutoProcessor.from_pretrained(str(out))
    llava = LlavaForConditionalGeneration.from_pretrained(str(out)).eval()
    for name in ("image-then-text", "two-images", "multi-turn"):
        messages = CONVERSATIONS[name]
        images = [_image(seed=k) for k in range(_n_images(messages))]
        inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(text=inputs, images=images, return_tensors="pt")
        with torch.no_grad():
            new = llava.generate(**inputs, max_new_tokens=8, do_sample=False)[0, inputs["input_ids"].shape[1]:]
        theirs = processor.tokenizer.decode(new, skip_special_tokens=True).strip()
        ours = GraftedModel.from_run(run).chat(_graft_messages(messages), images, max_new_tokens=8)
        assert theirs == ours and theirs and len(new) == 8, name


def test_unknown_part_type_is_named(exported):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(exported[1]))
    with pytest.raises(Exception, match="content part type video is not supported"):
        processor.apply_chat_template([{"role": "user", "content": [{"type": "video"}]}], tokenize=False)
