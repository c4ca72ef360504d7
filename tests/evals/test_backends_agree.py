"""A tiny graft evaluated through all three backends gives identical greedy predictions:
the HF path (GraftedModel), the in-process engine, and `graft serve` over HTTP."""

import json
from pathlib import Path

import pytest

from graft.evals import run_eval
from tests.serving.http.conftest import live_server  # noqa: F401 (fixture)

TASKS = ["example_pope", "example_mmbench"]
COMMON = dict(tasks=TASKS, limit=3, cache=False, n_boot=20, log=None)


def _predictions(out_dir, task):
    lines = (out_dir / f"samples_{task}.jsonl").read_text().splitlines()
    return [(r["id"], r["prediction"], r["error"]) for r in map(json.loads, lines)]


@pytest.fixture(scope="module")
def hf_out(tiny_run_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("hf")
    run_eval(str(tiny_run_dir), backend="hf", out_dir=out, **COMMON)
    for task in TASKS:
        preds = _predictions(out, task)
        assert all(err is None for _, _, err in preds)
        assert len(preds) == (3 if task == "example_pope" else 12)  # mmbench: 3 questions x 4 rotations
    return out


def test_engine_matches_hf(tiny_run_dir, hf_out, tmp_path):  # noqa: F811
    results = run_eval(str(tiny_run_dir), backend="engine", out_dir=tmp_path, **COMMON)
    assert results["tasks"]["example_pope"]["ttft_s"] is not None
    for task in TASKS:
        assert _predictions(tmp_path, task) == _predictions(hf_out, task)


def test_endpoint_matches_hf(live_server, hf_out, tmp_path):  # noqa: F811
    results = run_eval(live_server.url + "/v1", out_dir=tmp_path, retries=0, timeout=120, **COMMON)
    assert results["tasks"]["example_pope"]["ttft_s"] is not None
    for task in TASKS:
        assert _predictions(tmp_path, task) == _predictions(hf_out, task)


def test_hf_backend_expands_the_base_llm_path(tiny_run_dir, monkeypatch):  # noqa: F811
    # a config written as "~/..." or "$VAR/..." must still find the frozen LLM for text_only
    from graft.evals.backends.hf import GraftedBackend
    from graft.model import GraftedModel
    from graft.spec import GraftSpec

    model = GraftedModel.from_run(tiny_run_dir)
    llm = GraftSpec.expand(model.spec.llm.path)
    monkeypatch.setenv("GRAFT_TEST_LLM_ROOT", str(Path(llm).parent))
    model.spec.llm.path = f"$GRAFT_TEST_LLM_ROOT/{Path(llm).name}"
    assert GraftedBackend(model).base_llm == llm
