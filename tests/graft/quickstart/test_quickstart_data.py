"""`graft data quickstart`: layout, LLaVA format, correct labels, seeded splits, bad params."""

import json

import numpy as np
import pytest
from PIL import Image

from graft.cli import main as cli_main
from graft.errors import GraftConfigError
from graft.quickstart.data import (COLORS, DIGIT_WORDS, FORMAT, KINDS, TEXT_PROMPTS, DataParams,
                                   data_is_current, draw_scene, write_quickstart_data)

SMALL = dict(train_scenes=12, val_scenes=6, digits_test=10, digits_train=20, image_size=64)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("qs_data")
    meta = write_quickstart_data(out, DataParams(seed=0, **SMALL))
    return out, meta


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_layout_and_formats(small_data):
    out, meta = small_data
    train = json.loads((out / "train.json").read_text())
    assert len(train) == meta["train_samples"] == 12 + 20
    for sample in train:
        assert set(sample) == {"id", "image", "conversations"}
        conv = sample["conversations"]
        assert conv[0]["from"] == "human" and conv[0]["value"].startswith("<image>\n")
        assert [c["from"] for c in conv] == ["human", "gpt"] * (len(conv) // 2)
        assert sum(c["value"].count("<image>") for c in conv) == 1
        assert (out / sample["image"]).is_file()
    for task, n in (("shape_color", 6), ("shape_kind", 6), ("digits", 10)):
        rows = _jsonl(out / "eval" / f"{task}.jsonl")
        assert len(rows) == n == meta["eval"][task]
        for row in rows:
            assert set(row) == {"id", "image", "question", "answer"}
            assert (out / row["image"]).is_file() and " " not in row["answer"]
            with Image.open(out / row["image"]) as im:
                assert im.size == (64, 64) and im.mode == "RGB"
    text = _jsonl(out / "eval" / "text_only.jsonl")
    assert [r["question"] for r in text] == list(TEXT_PROMPTS)
    assert all(set(r) == {"id", "question"} for r in text) and len({r["id"] for r in text}) == len(text)
    assert {r["answer"] for r in _jsonl(out / "eval" / "digits.jsonl")} <= set("0123456789")


def test_digit_turns_agree(small_data):
    out, _ = small_data
    digits = [s for s in json.loads((out / "train.json").read_text()) if s["id"].startswith("digit_")]
    assert len(digits) == 20
    for sample in digits:
        conv = sample["conversations"]
        qa = {q["value"].removeprefix("<image>\n"): a["value"] for q, a in zip(conv[::2], conv[1::2])}
        d = int(qa["Which digit is shown?"])
        assert qa["Is the digit even or odd?"] == ("even" if d % 2 == 0 else "odd")
        assert qa["Write the digit as a word."] == DIGIT_WORDS[d]


def test_held_out_images_never_train(small_data):
    out, _ = small_data
    train_images = {s["image"] for s in json.loads((out / "train.json").read_text())}
    for task in ("shape_color", "shape_kind", "digits"):
        assert not train_images & {r["image"] for r in _jsonl(out / "eval" / f"{task}.jsonl")}
    # ids carry the sklearn index: no digit image is in both splits
    test_idx = {r["id"].rsplit("_", 1)[1] for r in _jsonl(out / "eval" / "digits.jsonl")}
    train_idx = {i.rsplit("_", 1)[1][:4] for i in train_images if "digit_" in i}
    assert len(test_idx) == 10 and len(train_idx) == 20 and not test_idx & train_idx


def test_scene_labels_match_pixels():
    from skimage.measure import label

    rng = np.random.default_rng(3)
    for _ in range(20):
        img, scene = draw_scene(rng, 128)
        px = np.asarray(img).astype(int)
        target = np.array(COLORS[scene.color])
        near = np.abs(px - target).max(-1) <= 25  # shape pixels (colour jitter is +-20)
        assert near.sum() > 50
        others = [np.abs(px - np.array(c)).max(-1) <= 25 for n, c in COLORS.items() if n != scene.color]
        assert all(o.sum() < near.sum() for o in others)
        assert label(near).max() == scene.count  # one connected blob per shape
        assert scene.kind in KINDS


def test_same_seed_same_data_other_seed_differs(tmp_path, small_data):
    out, _ = small_data
    again = tmp_path / "again"
    write_quickstart_data(again, DataParams(seed=0, **SMALL))
    assert (again / "train.json").read_text() == (out / "train.json").read_text()
    assert (again / "eval" / "digits.jsonl").read_text() == (out / "eval" / "digits.jsonl").read_text()
    assert data_is_current(again, DataParams(seed=0, **SMALL))
    assert not data_is_current(again, DataParams(seed=1, **SMALL))
    meta = json.loads((again / "meta.json").read_text())
    (again / "meta.json").write_text(json.dumps({**meta, "format": FORMAT - 1}))
    assert not data_is_current(again, DataParams(seed=0, **SMALL))  # an older generator's data is redone
    other = tmp_path / "other"
    write_quickstart_data(other, DataParams(seed=1, **SMALL))
    assert (other / "eval" / "digits.jsonl").read_text() != (out / "eval" / "digits.jsonl").read_text()


def test_text_prompts_fill_both_quantize_splits():
    from types import SimpleNamespace

    from graft.quantize.quality import split_samples

    assert len(set(TEXT_PROMPTS)) == len(TEXT_PROMPTS) >= 24
    rows = [SimpleNamespace(id=f"text_{k}", group=None) for k in range(len(TEXT_PROMPTS))]
    search, held = split_samples(rows, 0.5, 0)
    assert min(len(search), len(held)) >= 12


@pytest.mark.parametrize("bad, match", [
    (dict(train_scenes=0), "train_scenes=0"),
    (dict(digits_test=1797), "digits_test=1797"),
    (dict(image_size=8), "image_size=8"),
    (dict(digits_train=0), "digits_train=0"),
])
def test_bad_parameters(tmp_path, bad, match):
    with pytest.raises(GraftConfigError, match=match):
        write_quickstart_data(tmp_path, DataParams(**{**SMALL, **bad}))


def test_cli(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli_main(["data", "quickstart", "--out", str(blocker / "d")]) == 2
    assert f"{blocker} is a file, not a folder" in capsys.readouterr().err
    out = tmp_path / "d"
    assert cli_main(["data", "quickstart", "--out", str(out), "--seed", "2", "--train-scenes", "3",
                     "--val-scenes", "2", "--digits-test", "4", "--digits-train", "5",
                     "--image-size", "48"]) == 0
    assert "train.json 8 samples" in capsys.readouterr().out
    assert json.loads((out / "meta.json").read_text())["params"]["seed"] == 2
    small = ["--train-scenes", "3", "--val-scenes", "2", "--digits-test", "4", "--digits-train",
             "5", "--image-size", "48"]
    # the same parameters again: nothing to do; other ones: refused unless --overwrite
    assert cli_main(["data", "quickstart", "--out", str(out), "--seed", "2", *small]) == 0
    assert "already holds this data" in capsys.readouterr().out
    before = (out / "train.json").read_text()
    assert cli_main(["data", "quickstart", "--out", str(out), "--seed", "3", *small]) == 2
    assert f"--out {out} is not empty; --overwrite replaces" in capsys.readouterr().err
    assert (out / "train.json").read_text() == before
    assert cli_main(["data", "quickstart", "--out", str(out), "--seed", "3", "--overwrite",
                     *small]) == 0
    assert json.loads((out / "meta.json").read_text())["params"]["seed"] == 3


def test_cli_interrupted_leaves_no_partial_out_and_a_rerun_needs_no_overwrite(tmp_path, capsys,
                                                                            monkeypatch):
    import graft.quickstart.data as data

    small = ["--train-scenes", "3", "--val-scenes", "2", "--digits-test", "4", "--digits-train",
             "5", "--image-size", "48"]
    out = tmp_path / "dq"

    def ctrl_c(*args):  # after the scene PNGs, before any JSON: the old code left images/ only
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "digit_image", ctrl_c)
    assert cli_main(["data", "quickstart", "--out", str(out), *small]) == 130
    assert "graft data quickstart: interrupted;" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # neither --out nor its temp dir
    monkeypatch.undo()
    assert cli_main(["data", "quickstart", "--out", str(out), *small]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["eval", "images", "meta.json", "train.json",
                                                     "val.json"]
    sample = json.loads((out / "train.json").read_text())[0]
    assert (out / sample["image"]).is_file()  # paths stay relative to --out, not the temp dir
