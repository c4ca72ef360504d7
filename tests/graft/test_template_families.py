"""Label masks under each supported family's chat template layout (reduced to the parts that
decide where an answer starts and ends): exactly the answer and what ends the turn carry loss,
in one turn and several, and every image keeps its placeholder run."""

import pytest
from transformers import AutoTokenizer

from graft.inject import IMAGE_PLACEHOLDER
from graft.template import IGNORE_INDEX, encode_chat, llava_to_messages

# Qwen3: an empty think block opens the last assistant turn after the last user message only
QWEN3 = (
    "{%- set ns = namespace(last=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role != 'assistant' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- elif loop.index0 > ns.last and loop.last %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m.content.lstrip('\\n') + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# GLM-4: no end-of-turn text after an answer; the next role token (or eos) ends the turn
GLM4 = (
    "[gMASK]<sop>{%- for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}")
# Llama 3: trimmed contents, <|eot_id|> ends every turn
LLAMA3 = (
    "{%- for m in messages %}{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' "
    "+ m.content | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")
SPECIALS = ["<think>", "</think>", "[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>",
            "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

ONE = [{"from": "human", "value": "<image>\nColor?"}, {"from": "gpt", "value": "red"}]
TWO = ONE + [{"from": "human", "value": "<image>\nShape?"}, {"from": "gpt", "value": "circle"}]


@pytest.fixture(scope="module")
def tok(tiny_llama):
    tok = AutoTokenizer.from_pretrained(tiny_llama)  # eos: <|im_end|>
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    return tok


def _trained(tok, template, conv, training=True):
    tok.chat_template = template
    chat = encode_chat(tok, llava_to_messages(conv), [3] * (len(conv) // 2), training=training)
    assert [n for _, n in chat.image_spans] == [3] * (len(conv) // 2)
    for offset, n in chat.image_spans:
        assert chat.input_ids[offset:offset + n] == [IMAGE_PLACEHOLDER] * n
        assert chat.labels[offset:offset + n] == [IGNORE_INDEX] * n
    assert all(lab in (IGNORE_INDEX, t) for t, lab in zip(chat.input_ids, chat.labels))
    return tok.decode([lab for lab in chat.labels if lab != IGNORE_INDEX]), chat


@pytest.mark.parametrize("conv, want", [
    (ONE, "<think>\n\n</think>\n\nred<|im_end|>\n"),
    # the earlier turn has no think block in the whole chat: it must not be refused
    (TWO, "red<|im_end|>\n<think>\n\n</think>\n\ncircle<|im_end|>\n"),
])
def test_qwen3_multi_turn_labels(tok, conv, want):
    assert _trained(tok, QWEN3, conv)[0] == want


def test_glm4_learns_to_end_its_turn(tok):
    # the next role token ends a middle turn; the eos token is appended after the last one
    text, chat = _trained(tok, GLM4, TWO)
    assert text == "\nred<|user|>\ncircle<|im_end|>"
    assert chat.input_ids[-1] == tok.eos_token_id
    # a prompt (not training) is left as the template renders it
    assert _trained(tok, GLM4, TWO, training=False)[1].input_ids == chat.input_ids[:-1]


@pytest.mark.parametrize("template, conv, want", [
    (LLAMA3, TWO, "red<|eot_id|>circle<|eot_id|>"),
    (None, TWO, "red<|im_end|>\ncircle<|im_end|>\n"),  # the tiny tokenizer's ChatML
])
def test_closed_turns_append_nothing(tok, tiny_llama, template, conv, want):
    template = template or AutoTokenizer.from_pretrained(tiny_llama).chat_template
    text, chat = _trained(tok, template, conv)
    assert text == want
    assert chat.input_ids == _trained(tok, template, conv, training=False)[1].input_ids
