"""run_eval end to end on a tiny plain LLM: files, cache, compare and the CLI."""

import json
from pathlib import Path

import pytest

from graft.evals import compare_runs, get_task, run_eval
from graft.evals.backends.hf import PlainLLMBackend
from graft.evals.cache import ResponseCache


class CountingLLM(PlainLLMBackend):
    """The real HF backend, counting how many requests reach the model."""

    calls = 0

    def generate(self, requests):
        CountingLLM.calls += len(requests)
        return super().generate(requests)


@pytest.fixture
def text_data(tmp_path):
    (tmp_path / "eval").mkdir()
    rows = [{"id": f"text_{i}", "question": q} for i, q in enumerate(["Hello!", "Which digit is shown?", "red"])]
    (tmp_path / "eval" / "text_only.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_text_only_results_cache_and_compare(tiny_llama, text_data, tmp_path):
    backend = CountingLLM(tiny_llama)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    first = run_eval(backend, tasks=["text_only"], data_root=text_data, out_dir=tmp_path / "a",
                     cache=cache, n_boot=50, log=None)
    # the base LLM answers the references and, being the model too, matches them exactly
    task = first["tasks"]["text_only"]
    assert task["accuracy"] == 1.0 and task["n"] == 3 and task["n_errors"] == 0
    assert CountingLLM.calls == 3  # references and answers share one cache entry per sample
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    for key in ("config", "git", "packages", "hardware", "seed"):
        assert key in saved
    assert saved["tasks"]["text_only"]["scores"]["accuracy"]["ci"] == [1.0, 1.0]
    assert saved["tasks"]["text_only"]["definitions"] == {"identical": "graft (no official evaluator)"}
    rows = [json.loads(x) for x in (tmp_path / "a" / "samples_text_only.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["text_0", "text_1", "text_2"]
    assert all(r["prediction"] == r["target"] and r["latency"] > 0 and r["scores"]["identical"] == 1.0 for r in rows)

    again = run_eval(backend, tasks=["text_only"], data_root=text_data, out_dir=tmp_path / "b",
                     cache=cache, n_boot=50, log=None)
    assert CountingLLM.calls == 3  # nothing new reached the model
    assert again["tasks"]["text_only"]["n_cached"] == 3
    rows_b = [json.loads(x) for x in (tmp_path / "b" / "samples_text_only.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows_b] == [r["prediction"] for r in rows]

    report = compare_runs(tmp_path / "a", tmp_path / "b", n_boot=50)
    assert report["tasks"]["text_only"]["delta"] == 0.0 and report["tasks"]["text_only"]["ci"] == [0.0, 0.0]


def test_cli_eval_list_and_errors(tiny_llama, text_data, tmp_path, capsys):
    from graft.cli import main

    assert main(["eval", "--list"]) == 0
    assert "example_mmbench" in capsys.readouterr().out
    assert main(["eval", "--model", str(tiny_llama), "--tasks", "quickstart_digits"]) == 2
    assert "--data-root" in capsys.readouterr().err
    assert main(["eval", "--tasks", "text_only"]) == 2
    out = tmp_path / "cli"
    short = tmp_path / "text_only.yaml"  # the shipped task with a short answer, to keep CI fast
    short.write_text(Path(get_task("text_only").source).read_text().replace("max_new_tokens: 32", "max_new_tokens: 4"))
    code = main(["eval", "--model", str(tiny_llama), "--tasks", str(short), "--data-root", str(text_data),
                 "--limit", "2", "--out", str(out), "--no-cache", "--bootstrap", "20"])
    assert code == 0
    assert json.loads((out / "results.json").read_text())["tasks"]["text_only"]["n"] == 2
    assert main(["eval", "compare", str(out), str(out), "--bootstrap", "20"]) == 0
    assert "text_only" in capsys.readouterr().out
    # the same --out again: refused before anything runs, unless --overwrite
    before = (out / "results.json").read_text()
    again = ["eval", "--model", str(tiny_llama), "--tasks", str(short), "--data-root",
             str(text_data), "--limit", "1", "--out", str(out), "--no-cache", "--bootstrap", "20"]
    assert main(again) == 2
    assert f"--out {out} already holds results.json; --overwrite replaces it" in capsys.readouterr().err
    assert (out / "results.json").read_text() == before
    assert main(again + ["--overwrite"]) == 0
    assert json.loads((out / "results.json").read_text())["tasks"]["text_only"]["n"] == 1


def test_eval_compare_help_is_its_own(capsys):
    """`graft eval compare --help` shows compare's arguments, not eval's; a missing run is a
    usage error naming it."""
    from graft.cli import main

    assert main(["eval", "compare", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: graft eval compare [-h]") and "RUN_A" in out and "RUN_B" in out
    assert "--endpoint" not in out and "--tasks" not in out
    assert main(["eval", "compare", "only_one"]) == 2
    assert "the following arguments are required: RUN_B" in capsys.readouterr().err
    assert main(["eval", "--help"]) == 0
    assert "graft eval compare" in capsys.readouterr().out  # the example points to it


def test_unwritable_cache_is_a_clear_error(tmp_path):
    from graft.errors import GraftConfigError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(GraftConfigError, match="--no-cache"):
        ResponseCache(blocker / "cache.sqlite")
