"""`graft bench` flags: a bad value, output path, URL or config is one line naming the flag
(or file) and what is allowed, before anything is measured; never a traceback."""

from __future__ import annotations

import pytest

from tests.graft.cli_asserts import fails


@pytest.mark.parametrize("argv, needles", [
    (["linears", "--rows", "0"], ["argument --rows: 0 is out of range: use >= 1"]),
    (["linears", "--rows", "abc"], ["argument --rows: 'abc' is not an integer"]),
    (["linears", "--rows", "1,-3"], ["argument --rows: -3 is out of range"]),
    (["linears", "--rows", ","], ["argument --rows: ',' names no value"]),
    (["linears", "--repeats", "0"], ["argument --repeats: 0 is out of range"]),
    (["linear-micro", "--rows", "0"], ["argument --rows: 0 is out of range"]),
    (["linear-micro", "--min-seconds", "nan"], ["argument --min-seconds: 'nan' is not a finite"]),
    (["linear-micro", "--min-seconds", "0"], ["argument --min-seconds: 0 is out of range: use > 0"]),
    (["row-ops-micro", "--min-seconds", "nan"], ["argument --min-seconds: 'nan' is not a finite"]),
    (["row-ops-micro", "--repeats", "-1"], ["argument --repeats: -1 is out of range"]),
    (["engine", "m", "--threads", "0"], ["argument --threads: 0 is out of range: use >= 1"]),
    (["engine", "m", "--input-len", "0", "4"], ["argument --input-len: 0 is out of range"]),
    (["engine", "m", "--output-len", "4", "2"], ["--output-len 4 2: MIN is above MAX"]),
    (["engine", "m", "--input-len", "9", "3"], ["--input-len 9 3: MIN is above MAX"]),
    (["serve", "not-a-url"], ["argument url: 'not-a-url' is not an http(s) URL"]),
    (["serve", "http://h:port"], ["argument url: 'http://h:port' is not a URL"]),
    (["serve", "http://h", "--num-requests", "0"], ["argument --num-requests: 0 is out of range"]),
    (["serve", "http://h", "--rate", "-1"], ["argument --rate: -1 is out of range: use >= 0"]),
    (["serve", "http://h", "--rate", "inf"], ["argument --rate: 'inf' is not a finite number"]),
    (["serve", "http://h", "--image-ratio", "5"], ["argument --image-ratio: 5 is out of range: "
                                                   "use 0.0 <= value <= 1.0"]),
    (["serve", "http://h", "--concurrency", "0"], ["argument --concurrency: 0 is out of range"]),
    (["train", "x.yaml", "--steps", "0"], ["argument --steps: 0 is out of range"]),
])
def test_bad_bench_flags_are_one_line(argv, needles, capsys):
    fails(capsys, ["bench", *argv], f"graft bench {argv[0]}: error:", *needles)


def test_out_of_the_wrong_kind_is_refused_before_the_measurement(tmp_path, capsys):
    (tmp_path / "afile").write_text("mine")
    for cmd in (["engine", "m"], ["linears"], ["linear-micro"], ["row-ops-micro"],
                ["serve", "http://h"], ["train", "x.yaml"]):
        fails(capsys, ["bench", *cmd, "--out", str(tmp_path)],
              f"argument --out: output {tmp_path} is a directory; give a file path")
        fails(capsys, ["bench", *cmd, "--out", str(tmp_path / "afile" / "r.json")],
              f"{tmp_path / 'afile'} is a file, not a folder")
    assert (tmp_path / "afile").read_text() == "mine"


def test_linears_model_dir_without_a_config(tmp_path, capsys):
    fails(capsys, ["bench", "linears", str(tmp_path / "nope")], "MODEL_DIR", "no config.json")
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    fails(capsys, ["bench", "linears", str(tmp_path)], "not a decoder LLM config (KeyError")


def test_engine_prompts_longer_than_the_context_are_refused(tiny_llama, capsys):
    fails(capsys, ["bench", "engine", str(tiny_llama), "--skip-hf", "--num-requests", "1",
                   "--input-len", "4000", "8000"], "--input-len 4000 8000: MAX is above this "
                                                   "model's context")


def test_serve_against_no_server_is_one_line(capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    for extra in ([], ["--chaos", "--duration-s", "1"]):
        fails(capsys, ["bench", "serve", url, "--cache-probe", "0", *extra],
              f"{url}: no answer from {url}/v1/models (ConnectError", "start `graft serve`")


def test_train_bad_config_is_one_line_before_any_child(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("encoder: [\n")
    fails(capsys, ["bench", "train", str(bad)], f"{bad} line 2")
