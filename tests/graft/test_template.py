"""Chat formatting: placeholder runs, label masks, text-only prompts tokenize like the LLM."""

import pytest
from transformers import AutoTokenizer

from graft.errors import GraftDataError
from graft.inject import IMAGE_PLACEHOLDER
from graft.template import IGNORE_INDEX, encode_chat, llava_to_messages


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def test_image_runs_sized_and_placed(tok):
    msgs = [{"role": "user", "content": "<image>\nWhat is it? and <image>"},
            {"role": "assistant", "content": "a red circle"}]
    chat = encode_chat(tok, msgs, [5, 3])
    assert len(chat.image_spans) == 2
    (o1, n1), (o2, n2) = chat.image_spans
    assert (n1, n2) == (5, 3)
    assert chat.input_ids[o1:o1 + n1] == [IMAGE_PLACEHOLDER] * 5
    assert chat.input_ids[o2:o2 + n2] == [IMAGE_PLACEHOLDER] * 3
    assert chat.input_ids.count(IMAGE_PLACEHOLDER) == 8


def test_labels_only_on_assistant_turns(tok):
    msgs = llava_to_messages([
        {"from": "human", "value": "<image>\nColor?"}, {"from": "gpt", "value": "red"},
        {"from": "human", "value": "Shape?"}, {"from": "gpt", "value": "circle"}])
    chat = encode_chat(tok, msgs, [4])
    labeled = [t for t, lab in zip(chat.input_ids, chat.labels) if lab != IGNORE_INDEX]
    text = tok.decode(labeled)
    assert "red" in text and "circle" in text
    assert "Color" not in text and "Shape" not in text and "user" not in text
    for t, lab in zip(chat.input_ids, chat.labels):
        assert lab == IGNORE_INDEX or lab == t
    # every assistant turn ends with the end-of-turn token, which is learned
    assert labeled.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2


def test_text_only_prompt_matches_plain_tokenization(tok):
    msgs = [{"role": "user", "content": "Describe the picture in one sentence."}]
    chat = encode_chat(tok, msgs, [], add_generation_prompt=True)
    plain = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    plain = plain["input_ids"] if isinstance(plain, dict) or hasattr(plain, "keys") else plain
    assert chat.input_ids == list(plain)


@pytest.mark.parametrize("n_images", [0, 2])
def test_marker_count_mismatch_is_clear(tok, n_images):
    msgs = [{"role": "user", "content": "<image> what?"}, {"role": "assistant", "content": "x"}]
    with pytest.raises(GraftDataError, match="marker"):
        encode_chat(tok, msgs, [3] * n_images)


def test_unknown_role_names_turn():
    with pytest.raises(GraftDataError, match=r"conversations\[1\]"):
        llava_to_messages([{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}])


def test_continue_final_message_matches_hf_and_keeps_image_runs(tok):
    msgs = [{"role": "user", "content": "Name it."}, {"role": "assistant", "content": "It is a"}]
    chat = encode_chat(tok, msgs, [], continue_final_message=True)
    hf = tok.apply_chat_template(msgs, continue_final_message=True, tokenize=False)
    assert hf.endswith("It is a")
    assert chat.input_ids == tok(hf, add_special_tokens=False)["input_ids"]
    whole = encode_chat(tok, msgs, []).input_ids  # the same chat, its last turn closed
    assert whole[:len(chat.input_ids)] == chat.input_ids and len(whole) > len(chat.input_ids)
    msgs[0]["content"] = "<image>\nName it."
    with_image = encode_chat(tok, msgs, [3], continue_final_message=True)
    assert with_image.input_ids.count(IMAGE_PLACEHOLDER) == 3 and with_image.image_spans
    assert tok.decode([t for t in with_image.input_ids if t >= 0]).endswith("It is a")


@pytest.mark.parametrize("last, opened, words", [
    ("It is a", True, "add_generation_prompt=False"),
    ("  ", False, "needs text in the last message"),
])
def test_continue_final_message_refusals_are_clear(tok, last, opened, words):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": last}]
    with pytest.raises(GraftDataError, match=words):
        encode_chat(tok, msgs, [], add_generation_prompt=opened, continue_final_message=True)


def test_template_kwargs_reach_the_template(tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    tok.chat_template = ("{% if greeting is defined %}{{ greeting }}\n{% endif %}"
                         + tok.chat_template)
    msgs = [{"role": "user", "content": "hi"}]
    plain = encode_chat(tok, msgs, [], add_generation_prompt=True).input_ids
    greeted = encode_chat(tok, msgs, [], add_generation_prompt=True,
                          template_kwargs={"greeting": "Ahoy"}).input_ids
    assert tok.decode(greeted).startswith("Ahoy\n") and greeted[-len(plain):] == plain
