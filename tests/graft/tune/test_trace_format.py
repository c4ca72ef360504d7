"""The trace format: synthetic traces read back, and a bad line is one error naming the file,
the line number and the field."""

import json

import pytest

from graft.errors import GraftConfigError
from graft.tune.search import parse_slo
from graft.tune.synth import PROFILES, synth_trace
from graft.tune.trace import read_trace, write_trace
from tests.graft.cli_asserts import fails


@pytest.mark.parametrize("profile", PROFILES)
def test_synth_profiles_read_back(profile, tmp_path):
    path = write_trace(tmp_path / "t.jsonl", synth_trace(profile, n=16, seed=3))
    again = write_trace(tmp_path / "u.jsonl", synth_trace(profile, n=16, seed=3))
    assert path.read_bytes() == again.read_bytes()  # same seed, same file
    records = read_trace(path)
    assert len(records) == 16 and all(r.messages for r in records)
    assert [r.arrival for r in records] == sorted(r.arrival for r in records)
    hashes = [im.sha256 for r in records for im in r.images]
    if profile == "image-burst":
        assert len(set(hashes)) < len(hashes)  # repeats: the encoder cache has work to do
        assert all(r.messages[0]["content"][0]["type"] == "image_url" for r in records)
    else:
        assert not hashes


def _with_line(tmp_path, number: int, change: dict | str) -> str:
    records = synth_trace("chat", n=4)
    lines = [json.dumps(r) for r in records]
    lines[number - 1] = change if isinstance(change, str) else json.dumps(
        {**records[number - 1], **change})
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("change, needles", [
    ({"prompt_tokens": "many"}, ["line 3", "'prompt_tokens'", "an int from 0", "'many'"]),
    ({"status": "fine"}, ["line 3", "'status'", "ok, error, deadline, abort"]),
    ({"images": [{"width": 8, "height": 8}]}, ["line 3", "images[0]", "'sha256' is missing"]),
    ({"colour": 1}, ["line 3", "unknown field 'colour'"]),
    ("{not json", ["line 3", "not valid JSON"]),
])
def test_bad_line_names_line_and_field(tmp_path, change, needles):
    path = _with_line(tmp_path, 3, change)
    with pytest.raises(GraftConfigError) as err:
        read_trace(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path} line 3")
    for needle in needles:
        assert needle in message, message


def test_missing_field_and_cli_error(tmp_path, capsys, tiny_llama):
    record = synth_trace("chat", n=1)[0]
    del record["output_tokens"]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(record) + "\n")
    err = fails(capsys, ["tune", str(path), "--model", str(tiny_llama), "--slo",
                         "ttft_p99_ms=100", "--out", str(tmp_path / "tuned.yaml")],
                "line 1", "'output_tokens' is missing")
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text, needle", [("ttft=5", "METRIC=MS"), ("ttft_p99_ms=x", "not a number"),
                                          ("tpot_p99_ms=0", "> 0"), ("", "empty")])
def test_bad_slo(text, needle):
    with pytest.raises(GraftConfigError, match=needle):
        parse_slo(text)


def test_slo_parses():
    assert parse_slo("ttft_p99_ms=500, tpot_p50_ms=20") == {"ttft_p99_ms": 500.0,
                                                            "tpot_p50_ms": 20.0}


def test_image_bound_is_the_replays_own():
    """The reader's pixel bound is what the replay's server settings (graft serve's defaults)
    accept: a trace image the reader lets through is one the replay can serve."""
    from graft.serving.multimodal.media import MediaConfig
    from graft.tune.trace import MAX_IMAGE_PIXELS

    assert MAX_IMAGE_PIXELS == MediaConfig().max_image_pixels
