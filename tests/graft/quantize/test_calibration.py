"""`--calibration FILE`: a bad record is one line naming the file and the line (or sample),
not only what is wrong with it, nor a traceback."""

import json

import pytest

from graft.errors import GraftConfigError


@pytest.fixture(scope="module")
def qe(planted_llm):
    from graft.quantize.engine import QuantEngine

    return QuantEngine(planted_llm)


@pytest.mark.parametrize("bad, message", [
    ({"conversations": [{"from": "human", "value": "<image>\nWhat?"}, {"from": "gpt", "value": "A."}],
      "image": "missing.png"}, "line 3: image file .*missing.png does not exist"),
    ({"messages": "hello"}, "line 3: 'messages' must be a list of"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, "line 3: conversations\\[0\\].from='robot'"),
])
def test_a_bad_record_names_the_file_and_line(qe, tmp_path, bad, message):
    from graft.quantize.calibration import load_calibration

    good = {"text": "The quick brown fox jumps over the lazy dog."}
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps(r) + "\n" for r in (good, good, bad)))
    with pytest.raises(GraftConfigError, match=f"^--calibration {calib} {message}") as err:
        load_calibration(qe, str(calib), n_samples=8, max_tokens=64)
    assert "\n" not in str(err.value)
    assert len(load_calibration(qe, str(calib), n_samples=2, max_tokens=64)) == 2  # the good lines
