"""Input that used to end in a traceback (issue #46, item 3) is one line naming the file, the
line or field, and the fix, with exit 2: config values YAML types on its own, numbers past
Python's 4300-digit limit in every YAML/JSON file graft reads, trace lines whose numbers would
overflow a sleep or fill the memory, and a bad WORLD_SIZE."""

import json

import pytest

from graft.errors import GraftConfigError
from graft.tune.synth import synth_trace
from tests.graft.cli_asserts import fails

HUGE = "1" * 5000  # past sys.get_int_max_str_digits() (4300)


def one_line(capsys, argv, *needles) -> str:
    capsys.readouterr()  # what fixtures printed while building the tiny models
    err = fails(capsys, argv, *needles)
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_serve_config_unquoted_number_for_text(capsys, tiny_llama, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"path: {tiny_llama}\napi_key: 12345\n")
    one_line(capsys, ["serve", "--config", str(config)], f"{config}: api_key: must be text",
             "int 12345", "put the value in quotes")
    config.write_text(f"path: {tiny_llama}\nhost: yes\n")  # YAML 1.1: a bool
    one_line(capsys, ["serve", "--config", str(config)], "host: must be text", "bool True")


def test_serve_config_huge_integer(capsys, tiny_llama, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"path: {tiny_llama}\nport: {HUGE}\n")
    one_line(capsys, ["serve", "--config", str(config)],
             f"--config {config} line 2, column 7", "5000 digits", "use a smaller number")


def test_spec_yaml_and_set_huge_integer(capsys, make_spec, tmp_path):
    spec = tmp_path / "graft.yaml"
    make_spec().save(spec)
    good = spec.read_text()
    spec.write_text(good + f"seed_extra: {HUGE}\n")
    line = len(good.splitlines()) + 1
    one_line(capsys, ["train", str(spec), "--dry-run"], f"{spec} line {line}, column 13",
             "5000 digits")
    spec.write_text(good)
    one_line(capsys, ["train", str(spec), "--dry-run", "--set", f"train.lr={HUGE}"],
             "--set train.lr line 1", "5000 digits")


def test_eval_task_file_huge_integer(capsys, tiny_llama, tmp_path):
    task = tmp_path / "task.yaml"
    task.write_text(f"name: t\nlimit: {HUGE}\n")
    one_line(capsys, ["eval", "--model", str(tiny_llama), "--tasks", str(task),
                      "--out", str(tmp_path / "out")], f"{task} line 2, column 8", "5000 digits")


def test_quantization_config_huge_integer(capsys, tiny_llama, tmp_path):
    quant = tmp_path / "quant.json"
    quant.write_text('{"default": "int8",\n "modules": {"x": {"group_size": ' + HUGE + '}}}')
    one_line(capsys, ["serve", str(tiny_llama), "--quantization", str(quant)],
             f"quantization config {quant}: the number at line 2, column 34", "5000 digits")


def _trace(tmp_path, change: dict | str, line: int = 2):
    records = [json.dumps(r) for r in synth_trace("chat", n=3, seed=5)]
    records[line - 1] = change if isinstance(change, str) else \
        json.dumps({**json.loads(records[line - 1]), **change})
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(records) + "\n")
    return path


def _tune(trace, llm, tmp_path, *extra):
    return ["tune", str(trace), "--model", str(llm), "--slo", "ttft_p99_ms=1000",
            "--out", str(tmp_path / "tuned.yaml"), "--max-model-len", "256", *extra]


@pytest.mark.parametrize("change, needles", [
    ({"arrival": 1e308}, ["field 'arrival' must be a number of seconds from 0 to 1e+10"]),
    ('{"v": 1, "arrival": 1.0, "prompt_tokens": ' + "9" * 4301 + ', "output_tokens": 1}',
     ["the number at column 43 has 4301 digits", "use a smaller number"]),
    ({"prompt_tokens": 10 ** 30}, ["field 'prompt_tokens' must be an int from 0 to 1e+09"]),
    ({"prompt_tokens": 300}, ["field 'prompt_tokens' is 300, more than the model's context of "
                              "256 tokens", "fix the line or drop it"]),
    ({"output_tokens": 100_000}, ["field 'output_tokens' is 100000, more than"]),
    ({"images": [{"width": 10 ** 9, "height": 10 ** 9, "sha256": "0" * 64}]},
     ["images[0]: 1000000000x1000000000 pixels, over the 16777216 a replay serves"]),
    ({"arrival": float("inf")}, ["field 'arrival' must be a number of seconds"]),
])
def test_tune_trace_line_errors(capsys, tiny_llama, tmp_path, change, needles):
    trace = _trace(tmp_path, change)
    one_line(capsys, _tune(trace, tiny_llama, tmp_path), f"{trace} line 2: ", *needles)
    assert not (tmp_path / "tuned.yaml").exists()


def test_tune_replay_too_long(capsys, tiny_llama, tmp_path):
    # each arrival is a fine time, but the gap between them is 300 years of real-time replay
    trace = _trace(tmp_path, {"arrival": 9.9e9}, line=3)
    one_line(capsys, _tune(trace, tiny_llama, tmp_path), "its arrivals span",
             "over 86400 s (a day); raise --speed")
    one_line(capsys, _tune(_trace(tmp_path, {}), tiny_llama, tmp_path, "--speed", "1e-300"),
             "at --speed 1e-300 would last")


def test_tune_counts_bounded_by_the_models_own_context(capsys, tiny_llama, tmp_path):
    from transformers import AutoConfig

    context = AutoConfig.from_pretrained(tiny_llama).max_position_embeddings
    trace = _trace(tmp_path, {"max_tokens": context + 1})
    argv = _tune(trace, tiny_llama, tmp_path)[:-2]  # no --max-model-len: the model's own
    one_line(capsys, argv, f"line 2: field 'max_tokens' is {context + 1}, more than the "
                           f"model's context of {context} tokens")


def test_tune_run_dir_whose_llm_moved(capsys, tiny_run_dir, tmp_path):
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir, run)
    spec = yaml.safe_load((run / "graft.yaml").read_text())
    spec["llm"]["path"] = str(tmp_path / "moved")
    (run / "graft.yaml").write_text(yaml.safe_dump(spec))
    argv = _tune(_trace(tmp_path, {}), run, tmp_path)[:-2]
    one_line(capsys, argv, f"its llm.path {tmp_path / 'moved'} is not an HF LLM dir")


def test_world_size_not_a_number(capsys, make_spec, tmp_path, monkeypatch):
    spec = tmp_path / "graft.yaml"
    make_spec().save(spec)
    monkeypatch.setenv("WORLD_SIZE", "abc")
    one_line(capsys, ["train", str(spec), "--plan"], "environment variable WORLD_SIZE: 'abc' is "
                                                     "not an integer", "or unset it")
    monkeypatch.setenv("WORLD_SIZE", "0")
    one_line(capsys, ["train", str(spec), "--plan"], "WORLD_SIZE: 0 is out of range")
    from graft.errors import GraftConfigError
    from graft.train.distributed import check_launch

    with pytest.raises(GraftConfigError, match="WORLD_SIZE: 'x1' is not an integer"):
        check_launch(None, {"WORLD_SIZE": "x1"})


def test_serve_config_takes_json_flags_as_yaml_mappings(tiny_llama, tmp_path):
    """--kv-transfer-config is JSON text on the command line; in serve.yaml a mapping reads
    naturally, and is checked as the flag's JSON is."""
    import argparse

    from graft.serving.http import serve_cli
    from graft.serving.http.fleet.pd import parse_kv_transfer_config
    from graft.serving.http.serve_config import parse_args

    config = tmp_path / "serve.yaml"
    config.write_text(f"path: {tiny_llama}\nkv_transfer_config:\n  kv_role: kv_consumer\n"
                      "  kv_connector_extra_config:\n    prefill_peers: ['10.0.0.2:8001']\n")
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parse_args(parser, ["--config", str(config)])
    assert parse_kv_transfer_config(args.kv_transfer_config).prefill_peers == (("10.0.0.2", 8001),)
    config.write_text(f"path: {tiny_llama}\nmax_num_seqs:\n  a: 1\n")  # not a JSON flag
    with pytest.raises(GraftConfigError, match="must be a single value"):
        parse_args(parser, ["--config", str(config)])
