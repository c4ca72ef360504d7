"""Task YAML loading, data loading and the errors bad input gets."""

import json

import pytest

from graft.errors import GraftConfigError, GraftDataError
from graft.evals.dataset import load_samples
from graft.evals.task import get_task, list_tasks, load_task_file


def _write_task(tmp_path, extra="", data="q.jsonl", name="t"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\ndata: {data}\ndata_root: .\n{extra}")
    return path


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_shipped_tasks_load():
    tasks = list_tasks()
    for name in ("quickstart_shape_color", "quickstart_shape_kind", "quickstart_digits", "text_only",
                 "example_vqav2", "example_pope", "example_mmbench", "example_captions"):
        assert name in tasks
    assert len(load_samples(tasks["example_vqav2"])) == 12
    assert len(load_samples(tasks["example_pope"], limit=3)) == 3
    # 6 questions x 4 rotations; all rotations of a question share its group
    mmb = load_samples(tasks["example_mmbench"])
    assert len(mmb) == 24 and len({s.group for s in mmb}) == 6
    assert mmb[0].prompt.startswith("<image>\nWhich shape is shown?\nA. circle")
    assert {s.options[s.target] for s in mmb if s.group == "mmb0"} == {"circle"}


def test_unknown_key_names_file_and_key(tmp_path):
    path = _write_task(tmp_path, "metric: exact_match\n")
    with pytest.raises(GraftConfigError, match=r"t\.yaml.*unknown key.*'metric'"):
        load_task_file(path)
    path = _write_task(tmp_path, "generation: {max_tokens: 3}\n")
    with pytest.raises(GraftConfigError, match=r"generation.*'max_tokens'"):
        load_task_file(path)
    path = _write_task(tmp_path, "metrics: [bleu]\n")
    with pytest.raises(GraftConfigError, match="bleu"):
        load_task_file(path)


def test_missing_files(tmp_path):
    with pytest.raises(GraftConfigError, match="does not exist"):
        get_task(str(tmp_path / "nope.yaml"))
    with pytest.raises(GraftConfigError, match="unknown task 'nope'"):
        get_task("nope")
    spec = load_task_file(_write_task(tmp_path))
    with pytest.raises(GraftDataError, match=r"data file .*q\.jsonl does not exist"):
        load_samples(spec)
    with pytest.raises(GraftConfigError, match="--data-root"):
        load_samples(get_task("quickstart_digits"))


def test_bad_lines_named_by_file_and_line(tmp_path):
    spec = load_task_file(_write_task(tmp_path))
    _write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q", "answer": "x"}, "{not json"])
    with pytest.raises(GraftDataError, match=r"q\.jsonl:2: not valid JSON"):
        load_samples(spec)
    _write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q"}])
    with pytest.raises(GraftDataError, match=r"q\.jsonl:1: missing the answer field 'answer'"):
        load_samples(spec)
    _write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "answer": "x"}])
    with pytest.raises(GraftDataError, match=r"q\.jsonl:1: the prompt uses field 'question'"):
        load_samples(spec)
    _write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q", "answer": "x"}] * 2)
    with pytest.raises(GraftDataError, match=r"q\.jsonl:2: duplicate id 'a'"):
        load_samples(spec)
    _write_jsonl(tmp_path / "q.jsonl", [{"id": "a", "question": "q", "answer": "x", "image": "gone.png"}])
    with pytest.raises(GraftDataError, match=r"q\.jsonl:1: image .*gone\.png does not exist"):
        load_samples(spec)


def test_limit_larger_than_data_and_hooks(tmp_path):
    (tmp_path / "hooks.py").write_text(
        "def process_sample(r):\n    r['question'] = r['question'].upper()\n    return r\n")
    spec = load_task_file(_write_task(tmp_path, "hooks: hooks.py\n"))
    _write_jsonl(tmp_path / "q.jsonl", [{"id": str(i), "question": f"q{i}", "answer": "x"} for i in range(3)])
    samples = load_samples(spec, limit=100)
    assert [s.prompt for s in samples] == ["Q0", "Q1", "Q2"]


def test_wrong_types_named(tmp_path):
    with pytest.raises(GraftConfigError, match=r"'circular' must be bool"):
        load_task_file(_write_task(tmp_path, "circular: 'yes'\n"))
    with pytest.raises(GraftConfigError, match=r"generation: 'max_new_tokens' must be int"):
        load_task_file(_write_task(tmp_path, "generation: {max_new_tokens: '8'}\n"))


def test_vqav2_answer_dicts(tmp_path):
    spec = load_task_file(_write_task(tmp_path, "answer_field: answers\nmetrics: [vqa_accuracy]\n"))
    _write_jsonl(tmp_path / "q.jsonl", [{"id": 1, "question": "q", "answers": [{"answer": "two", "answer_id": 1}] * 10}])
    [sample] = load_samples(spec)
    assert sample.id == "1" and sample.target == ["two"] * 10
