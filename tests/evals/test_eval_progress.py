"""`graft eval` you can follow: a progress bar per task on stderr (off when not a terminal or
with --quiet) and results always written, by default into a new folder under the run dir."""

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

from graft.evals import get_task, run_eval
from graft.evals.backends.hf import PlainLLMBackend
from graft.evals.eval_cli import default_out_dir
from graft.evals.runner import build_requests, generate_cached, progress_chunk


def _short_task(tmp_path, data_root):
    """The shipped text_only task with 4-token answers, on three questions."""
    (data_root / "eval").mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"t{i}", "question": q} for i, q in enumerate(["Hello!", "Name a colour.", "2+2?"])]
    (data_root / "eval" / "text_only.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    short = tmp_path / "text_only.yaml"
    short.write_text(Path(get_task("text_only").source).read_text()
                     .replace("max_new_tokens: 32", "max_new_tokens: 4"))
    return str(short)


class Batches(PlainLLMBackend):
    """The real HF backend, recording the size of every generate call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, requests):
        self.calls.append(len(requests))
        return super().generate(requests)


def test_progress_bar_on_stderr_and_quiet(tiny_llama, tmp_path, capsys):
    task = _short_task(tmp_path, tmp_path / "data")
    backend = Batches(tiny_llama)
    run_eval(backend, [task], data_root=tmp_path / "data", cache=False, n_boot=10, log=None,
             progress=True)
    err = capsys.readouterr().err
    # the base LLM's references, then the answers: 3 questions each, one per call (HF)
    assert "text_only (base LLM)" in err and "3/3" in err
    assert backend.calls == [1] * 6  # references, then answers (no cache: both ask the model)
    run_eval(backend, [task], data_root=tmp_path / "data", cache=False, n_boot=10, log=None,
             progress=False)
    assert capsys.readouterr().err == ""
    assert backend.calls[6:] == [3, 3]  # no bar: each pass's misses in one call, as before


def test_cache_hits_count_towards_the_bar(tiny_llama, tmp_path):
    from graft.evals.cache import ResponseCache
    from graft.evals.dataset import load_samples

    spec = get_task(_short_task(tmp_path, tmp_path / "data"))
    samples = load_samples(spec, tmp_path / "data", None)
    requests = build_requests(spec, samples, 0)
    backend, cache = Batches(tiny_llama), ResponseCache(tmp_path / "c.sqlite")
    generate_cached(backend, cache, spec, samples[:2], requests[:2])
    ticks = []
    out = generate_cached(backend, cache, spec, samples, requests, progress=ticks.append)
    assert ticks == [2, 1] and backend.calls == [2, 1]  # 2 hits at once, then the one miss
    assert [r.cached for r in out] == [True, True, False]
    cache.close()


def test_progress_chunk_keeps_each_backend_batched():
    class Engine:
        chunk = 64

    class Endpoint:
        concurrency = 8

    assert progress_chunk(Engine()) == 64  # the engine's own batch: nothing changes
    assert progress_chunk(Endpoint()) == 32
    assert progress_chunk(object()) == 1


def test_cli_writes_results_under_the_run_dir_by_default(tiny_run_dir, tmp_path, capsys):
    from graft.cli import main

    run = shutil.copytree(tiny_run_dir, tmp_path / "run")
    task = _short_task(tmp_path, tmp_path / "data")
    code = main(["eval", "--model", str(run), "--tasks", task, "--data-root", str(tmp_path / "data"),
                 "--no-cache", "--bootstrap", "10", "--quiet"])
    assert code == 0
    out, err = capsys.readouterr()
    written = sorted((run / "eval").glob("*-text_only/results.json"))
    assert len(written) == 1
    assert out.strip().splitlines()[-1] == f"wrote {written[0]}"
    assert json.loads(written[0].read_text())["tasks"]["text_only"]["n"] == 3
    assert (written[0].parent / "samples_text_only.jsonl").is_file()
    assert "it/s" not in err and "q/s" not in err  # --quiet: no bar


def test_default_out_dir_names(tmp_path, tiny_run_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = datetime(2026, 12, 2, 4, 30, 5, tzinfo=timezone.utc)
    assert default_out_dir(str(tiny_run_dir), "text_only,evals/x.yaml", now) == \
        tiny_run_dir / "eval" / "20261202T043005Z-text_only+x"
    url = default_out_dir("http://127.0.0.1:8000/v1", "example_pope", now)
    assert url == Path("runs/eval/20261202T043005Z-127.0.0.1_8000_v1-example_pope")
    llm = default_out_dir("/models/smollm2/", "text_only", now)
    assert llm == Path("runs/eval/20261202T043005Z-smollm2-text_only")
    llm.mkdir(parents=True)  # taken (two evals in one second): the next name
    assert default_out_dir("/models/smollm2", "text_only", now) == Path(f"{llm}-2")
