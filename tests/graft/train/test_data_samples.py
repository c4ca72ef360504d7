"""The training data loader on the samples users get wrong: each bad one is refused in one
line naming the file and the sample (index, or line in JSON Lines), or skipped and counted."""

import json

import pytest
from PIL import Image
from transformers import AutoTokenizer

from graft.errors import GraftDataError
from graft.template import IGNORE_INDEX
from graft.train.data import prepare_samples
from tests.graft.cli_asserts import fails

GOOD = {"image": "a.png", "conversations": [
    {"from": "human", "value": "<image>\nWhat color?"}, {"from": "gpt", "value": "red"}]}


def _answer(value):
    return {"image": "a.png", "conversations": [
        {"from": "human", "value": "<image>\nWhat color?"}, {"from": "gpt", "value": value}]}


@pytest.fixture
def data_dir(tmp_path):
    Image.new("RGB", (32, 32), "red").save(tmp_path / "a.png")
    return tmp_path


@pytest.fixture(scope="module")
def tok(tiny_llama):
    return AutoTokenizer.from_pretrained(tiny_llama)


def _prepare(tok, path, **kw):
    kw.setdefault("max_length", 256)
    return prepare_samples(path, path.parent, tok, lambda w, h: 4, **kw)


@pytest.mark.parametrize("bad, words", [
    (_answer(""), r"conversations\[1\] is an empty answer"),
    (_answer(" \n "), r"conversations\[1\] is an empty answer"),
    (_answer(None), r"conversations\[1\]\.value is null"),  # not the text "None"
    ({**GOOD, "images": ["a.png"]}, "has both 'image' and 'images'; keep one"),
    ({"image": "a.png", "conversations": [{"from": "human", "value": ["<image>", "Q"]},
                                          {"from": "gpt", "value": "x"}]},
     r"conversations\[0\]\.value is \["),
])
def test_bad_answers_are_refused_or_skipped(tok, data_dir, bad, words):
    path = data_dir / "train.json"
    path.write_text(json.dumps([GOOD, bad]))
    with pytest.raises(GraftDataError, match=f"train.json sample 1: {words}"):
        _prepare(tok, path)
    samples, skipped = _prepare(tok, path, on_bad_sample="skip")
    assert len(samples) == 1 and len(skipped) == 1


def test_a_null_images_key_is_not_given(tok, data_dir):
    path = data_dir / "train.json"
    path.write_text(json.dumps([{**GOOD, "images": None}, {**_answer("blue"), "image": None,
                                                          "images": ["a.png"]}]))
    samples, _ = _prepare(tok, path)
    assert [len(s.image_paths) for s in samples] == [1, 1]


def test_json_lines_name_the_line(tok, data_dir):
    path = data_dir / "train.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(_answer("")) + "\n")
    with pytest.raises(GraftDataError, match=r"train.jsonl line 3: conversations\[1\]"):
        _prepare(tok, path)
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(GOOD)[:-1] + "\n")
    with pytest.raises(GraftDataError, match="train.jsonl line 2: not valid JSON"):
        _prepare(tok, path)


@pytest.mark.parametrize("raw, words", [
    (b"\xef\xbb\xbf" + json.dumps([GOOD]).encode(), None),  # a BOM: read as the text it is
    (json.dumps([_answer("rouge \xe9")], ensure_ascii=False).encode("latin-1"), "not UTF-8"),
])
def test_file_encoding(tok, data_dir, raw, words):
    path = data_dir / "train.json"
    path.write_bytes(raw)
    if words is None:
        assert len(_prepare(tok, path)[0]) == 1
    else:
        with pytest.raises(GraftDataError, match=words):
            _prepare(tok, path)


def _good_sample_refused(tok, data_dir, match):
    path = data_dir / "train.json"
    path.write_text(json.dumps([GOOD]))
    with pytest.raises(GraftDataError, match=match):
        _prepare(tok, path)


def test_huge_image_is_a_bad_sample(tok, data_dir, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # PIL refuses past twice this
    _good_sample_refused(tok, data_dir, "sample 0: image file .*a.png is too large")


def test_length_limit_names_the_llm_context(tok, data_dir):
    path = data_dir / "train.json"
    path.write_text(json.dumps([_answer("word " * 40)]))
    with pytest.raises(GraftDataError, match=r"LLM's context of 32 tokens .*data.max_length=256"):
        _prepare(tok, path, llm_context=32)
    with pytest.raises(GraftDataError, match=r"longer than data.max_length=32; .*raise"):
        _prepare(tok, path, max_length=32, llm_context=512)


def test_sample_with_no_trained_token_is_refused(tiny_llama, data_dir):
    tok = AutoTokenizer.from_pretrained(tiny_llama)
    # a template that drops assistant turns: the sample would train on nothing
    tok.chat_template = ("{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}"
                         "{% endif %}{% endfor %}")
    _good_sample_refused(tok, data_dir, "sample 0: has no answer token that carries loss")


def test_labels_cover_only_the_answers(tok, data_dir):
    path = data_dir / "train.jsonl"
    turns = GOOD["conversations"] + [{"from": "human", "value": "Sure?"},
                                     {"from": "gpt", "value": "yes"}]
    path.write_text(json.dumps({**GOOD, "conversations": turns}))
    (sample,), _ = _prepare(tok, path, system_prompt="Be brief.")
    trained = [lab for lab in sample.chat.labels if lab != IGNORE_INDEX]
    assert tok.decode(trained) == "red<|im_end|>\nyes<|im_end|>\n"


def test_graft_train_names_the_bad_line_and_writes_nothing(capsys, make_spec, data_dir, tmp_path):
    path = data_dir / "train.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps(_answer(None)) + "\n")
    spec = make_spec(max_steps=1)
    spec.data.train, spec.data.image_root = str(path), str(data_dir)
    spec.save(tmp_path / "graft.yaml")
    fails(capsys, ["train", str(tmp_path / "graft.yaml"), "--dry-run"],
          "train.jsonl line 2: conversations[1].value is null", "on_bad_sample: skip")
    err = fails(capsys, ["train", str(tmp_path / "graft.yaml")], "train.jsonl line 2")
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run" / "graft.yaml").exists()
    from graft.cli import main

    assert main(["train", str(tmp_path / "graft.yaml"), "--dry-run",
                 "--set", "data.on_bad_sample=skip"]) == 0
    assert "skipped: " + str(path) + " line 2: conversations[1].value is null" in capsys.readouterr().out
