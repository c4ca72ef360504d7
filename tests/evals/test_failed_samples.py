"""A failed request (prediction None) is wrong under every metric, and images that cannot be
decoded stop the run before any model loads, like missing ones."""

import json

import pytest

from graft.errors import GraftDataError
from graft.evals.dataset import Sample, load_samples
from graft.evals.metrics import METRICS
from graft.evals.stats import columns_of, group_index
from graft.evals.task import load_task_file

_OPTIONS = {"A": "a red circle", "B": "a blue square"}
# per metric: two samples (targets) and the right answers to them
_CASES = {
    "exact_match": (["red", "blue"], ["red", "blue"]),
    "identical": (["red", "blue"], ["red", "blue"]),
    "vqa_accuracy": ([["red"] * 10, ["blue"] * 10], ["red", "blue"]),
    "vqa_accuracy_lmms_eval": ([["red"] * 10, ["blue"] * 10], ["red", "blue"]),
    "multiple_choice": (["A", "B"], ["A", "B"]),
    "circular_choice": (["A", "B"], ["A", "B"]),
    "yes_no": (["yes", "no"], ["yes", "no"]),
    "yes_no_lmms_eval": (["yes", "no"], ["yes", "no"]),
    "anls": ([["red"], ["blue"]], ["red", "blue"]),
    "cider_d": ([["a red circle"], ["a blue square"]], ["a red circle", "a blue square"]),
}


def _aggregate(name, preds, targets):
    samples = [Sample(str(i), "q", target=t, options=_OPTIONS) for i, t in enumerate(targets)]
    metric = METRICS[name]
    records = metric.score(preds, samples)
    return metric.aggregate(columns_of(records), group_index([s.id for s in samples]))


@pytest.mark.parametrize("name", sorted(METRICS))
def test_every_metric_scores_failed_samples_wrong(name):
    assert set(_CASES) == set(METRICS)  # a new metric joins this test
    targets, right = _CASES[name]
    primary = METRICS[name].primary
    assert _aggregate(name, right, targets)[primary] > 0
    failed = _aggregate(name, [None, None], targets)
    assert failed[primary] == 0.0
    if "accuracy" in failed:
        assert failed["accuracy"] == 0.0


@pytest.mark.parametrize("name", ["yes_no", "yes_no_lmms_eval"])
def test_failed_yes_question_is_missed_in_recall(name):
    """POPE read a failed (empty) answer as yes; lmms-eval's recall left it out."""
    agg = _aggregate(name, ["yes", None, "no", "no"], ["yes", "yes", "no", "no"])
    assert agg["accuracy"] == pytest.approx(3 / 4)
    assert agg["precision"] == 1.0 and agg["recall"] == pytest.approx(1 / 2)


def test_failed_requests_score_wrong_end_to_end(failed_run, tmp_path):
    """The audit's case: every request failed, yet f1 was 0.6667 and yes-questions "correct"."""
    task = failed_run(tmp_path / "out")["tasks"]["example_pope"]
    assert task["n_errors"] == task["n"] == 4
    assert task["score"] == 0.0 and task["accuracy"] == 0.0
    rows = [json.loads(x) for x in (tmp_path / "out" / "samples_example_pope.jsonl").read_text().splitlines()]
    assert {r["target"] for r in rows} == {"yes", "no"}
    assert all(r["error"] and r["scores"]["correct"] == 0.0 and r["scores"]["pred_yes"] == 0.0 for r in rows)


def _image_task(tmp_path, image_bytes: bytes):
    (tmp_path / "bad.png").write_bytes(image_bytes)
    rows = [{"id": "a", "question": "q", "answer": "yes", "image": "bad.png"}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "t.yaml"
    path.write_text("name: t\ndata: q.jsonl\ndata_root: .\nmetrics: [yes_no]\n")
    return path


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buf, "PNG")
    return buf.getvalue()


def test_undecodable_images_fail_before_the_model_loads(tmp_path, capsys):
    from graft.cli import main

    assert len(load_samples(load_task_file(_image_task(tmp_path, _png())))) == 1
    for data in (b"this is text, not a picture", _png()[:-30]):  # not an image; a truncated PNG
        spec = load_task_file(_image_task(tmp_path, data))
        with pytest.raises(GraftDataError, match=r"q\.jsonl:1: image .*bad\.png cannot be decoded .*'image'"):
            load_samples(spec)
    # the CLI says so in one line, before it looks at the model (which does not exist here)
    code = main(["eval", "--model", str(tmp_path / "no_model"), "--tasks", str(tmp_path / "t.yaml"),
                 "--out", str(tmp_path / "out"), "--no-cache"])
    err = capsys.readouterr().err
    assert code == 2 and "bad.png cannot be decoded" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
