"""docs/examples/lm-eval (docs/evals.md): the task files make_tasks.py writes are the ones the
doc's lm-eval run reads (34 multiple-choice questions whose answer is among their choices, 12
completions), with data paths that resolve wherever they are written."""

import json
import runpy
import sys
from pathlib import Path

from graft.loads import yaml_loads

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "lm-eval"


def test_make_tasks_writes_the_two_tasks(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["make_tasks.py", str(tmp_path / "tasks")])
    runpy.run_path(str(EXAMPLE / "make_tasks.py"), run_name="__main__")
    out = tmp_path / "tasks"
    mc = [json.loads(line) for line in (out / "mc.jsonl").read_text().splitlines()]
    gen = [json.loads(line) for line in (out / "gen.jsonl").read_text().splitlines()]
    assert len(mc) == 34 and len(gen) == 12
    assert all(0 <= q["answer"] < len(q["choices"]) == 4 for q in mc)
    for name, kind in (("graft_mc", "multiple_choice"), ("graft_gen", "generate_until")):
        task = yaml_loads((out / f"{name}.yaml").read_text(), name)
        assert task["task"] == name and task["output_type"] == kind
        assert Path(task["dataset_kwargs"]["data_files"]["test"]).is_file()
