"""`graft quantize` on a tiny LLM through the real engine: the planted harmless group is found,
the files are written, quant.json reproduces the measured answers, held-out is separate."""

import json

import pytest

from graft.errors import GraftConfigError
from graft.quantize import EvalSettings, Goal, quantize_search

# fp32 or int4 per group: int4 ruins every group of the tiny model but the planted one
SETTINGS = EvalSettings(granularity="layer", schemes=("fp32", "int4"), decode_tokens=4,
                        decode_repeats=1, n_chunks=2)


@pytest.fixture(scope="module")
def searched(planted_llm, text_task, tmp_path_factory):
    task, calib = text_task
    out = tmp_path_factory.mktemp("quant_out")
    settings = EvalSettings(**{**vars(SETTINGS), "calibration": str(calib)})
    report = quantize_search(planted_llm, [str(task)], out, goal=Goal("drop", 0.0),
                             settings=settings, max_evals=6, n_boot=50, progress=False,
                             log=lambda m: None)
    return out, report, settings


def test_planted_harmless_group_is_quantized_and_quality_kept(searched):
    out, report, _ = searched
    chosen, base = report["chosen"], report["baseline"]
    assert chosen["assignment"]["layers.1.mlp"] == "int4-g32"  # exact there: free bytes
    assert set(chosen["assignment"].values()) == {"fp32", "int4-g32"}
    assert chosen["quality"] == base["quality"] and chosen["weight_bytes"] < base["weight_bytes"]
    samples = base["tokens_per_s_samples"]  # the real evaluator re-measured the baseline
    assert list(samples) == ["start", "after sensitivity", "after anchors", "end"]
    assert base["tokens_per_s"] == max(samples.values()) > 0
    points = [json.loads(line) for line in (out / "evaluated.jsonl").read_text().splitlines()]
    alone = next(p for p in points if p["key"] == "layers.1.mlp=int4-g32")
    assert alone["kl"] == pytest.approx(0.0, abs=1e-6) and alone["phase"] == "sensitivity"
    assert {p["phase"] for p in points} >= {"baseline", "sensitivity", "anchor", "search"}
    assert all(p["predicted_quality"] is not None for p in points if p["phase"] != "baseline")
    assert (out / "pareto.png").stat().st_size > 1000


def test_quant_json_loads_and_gives_the_measured_answers(searched):
    from graft.evals.runner import build_requests
    from graft.evals.backends.engine import EngineBackend
    from graft.quantize.quality import load_tasks

    out, report, settings = searched
    state = json.loads((out / "state.json").read_text())
    measured = next(p for p in state["points"] if p["key"] == report["chosen"]["key"])
    backend = EngineBackend(state["fingerprint"]["model"], quantization=str(out / "quant.json"))
    plan = backend.engine.runner.quant_plan
    assert plan["layers.1.mlp.gate_up_proj"].name == "int4-g32"
    split = load_tasks(state["fingerprint"]["tasks"], None, settings.heldout_fraction, 0)[0]
    answers = [r.prediction for r in backend.generate(build_requests(split.spec, split.search, 0))]
    assert answers == measured["answers"]["tiny_text"]


def test_heldout_rescoring_uses_only_unseen_questions(searched):
    from graft.evals.compare import compare_runs

    out, report, _ = searched
    state = json.loads((out / "state.json").read_text())
    search_ids = set(state["fingerprint"]["splits"]["tiny_text"])
    held = [json.loads(line) for line in (out / "heldout" / "chosen" / "samples_tiny_text.jsonl")
            .read_text().splitlines()]
    assert held and not search_ids & {r["id"] for r in held}
    assert len(search_ids) + len(held) == 12
    res = report["heldout"]["chosen"]
    assert res["tasks"]["tiny_text"]["ci"][0] <= res["tasks"]["tiny_text"]["score"]
    again = compare_runs(out / "heldout" / "fp32", out / "heldout" / "chosen", n_boot=50)
    assert again["tasks"]["tiny_text"]["delta"] == res["vs_fp32"]["tiny_text"]["delta"]


def test_rerun_resumes_without_measuring_again(searched, planted_llm, text_task, monkeypatch):
    from graft.quantize.evaluator import Evaluator

    out, report, settings = searched

    def no_measure(*args, **kwargs):
        raise AssertionError("a point was measured again")

    monkeypatch.setattr(Evaluator, "measure", no_measure)
    again = quantize_search(planted_llm, [str(text_task[0])], out, goal=Goal("drop", 0.0),
                            settings=settings, max_evals=6, n_boot=50, progress=False,
                            log=lambda m: None)
    assert again["chosen"]["key"] == report["chosen"]["key"]


def test_bad_inputs_fail_with_one_line(planted_llm, text_task, tmp_path):
    task, calib = text_task
    run = lambda **kw: quantize_search(planted_llm, kw.pop("tasks", [str(task)]), tmp_path,  # noqa: E731
                                       progress=False, log=lambda m: None, **kw)
    with pytest.raises(GraftConfigError, match="unknown task 'nope'"):
        run(tasks=["nope"])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(GraftConfigError, match="holds no calibration text"):
        run(settings=EvalSettings(calibration=str(empty)))
    with pytest.raises(GraftConfigError, match="no training data to calibrate on"):
        run(settings=EvalSettings())
    with pytest.raises(GraftConfigError, match=r"--budget-bytes 10: no configuration meets it; "
                                               r"the closest is .* bytes per token"):
        run(goal=Goal("bytes", 10), settings=EvalSettings(calibration=str(calib)))
    with pytest.raises(GraftConfigError, match="--schemes='int3' is not a weight scheme"):
        run(settings=EvalSettings(schemes=("int3",)))


def test_run_dir_calibrates_on_its_images_and_encodes_each_image_once(planted_run, tmp_path,
                                                                      monkeypatch):
    from graft.quantize import engine as engine_module

    run, task = planted_run
    engines = []

    class Spy(engine_module.QuantEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            engines.append(self)

    monkeypatch.setattr(engine_module, "QuantEngine", Spy)
    report = quantize_search(run, [str(task)], tmp_path, goal=Goal("drop", 0.5), settings=SETTINGS,
                             max_evals=2, n_boot=20, progress=False, log=lambda m: None)
    n_points = len((tmp_path / "evaluated.jsonl").read_text().splitlines())
    assert n_points > 5 and engines[0].engine.mm.misses == 12  # every candidate, 12 encodings
    assert report["chosen"] is not None and (tmp_path / "quant.json").is_file()
