"""graft.loads: every way YAML or JSON text fails to parse is one error of the caller's class
naming where (line and column) and the fix; the files graft reads go through it."""

import pytest

from graft.errors import GraftConfigError, GraftDataError
from graft.loads import json_loads, yaml_loads

HUGE = "7" * 4400


@pytest.mark.parametrize("text, needles", [
    (f"a: 1\nb: [2, {HUGE}]\n", ["f.yaml line 2, column 8", "has 4400 digits", "limit of 4300"]),
    ("a: 2024-13-01\n", ["f.yaml line 1, column 4", "month must be in 1..12",
                         "quote the value if it is text"]),
    ("a: [1,\n  b", ["f.yaml line 2, column 4", "not valid YAML"]),
    ("[" * 5000, ["f.yaml: nested too deeply"]),
])
def test_yaml(text, needles):
    with pytest.raises(GraftConfigError) as err:
        yaml_loads(text, "f.yaml")
    assert "\n" not in str(err.value)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize("text, needles", [
    ('{"a": ' + HUGE + "}", ["where: the number at column 7 has 4400 digits"]),
    ('{"a": 1,\n "b": ' + HUGE + "}", ["where: the number at line 2, column 7"]),
    ('{"a": }', ["where: not valid JSON (Expecting value at column 7)"]),
    ('{"a": 1,\n "b": }', ["not valid JSON (Expecting value at line 2, column 7)"]),
    ("[" * 100_000 + "]" * 100_000, ["where: nested too deeply"]),
])
def test_json(text, needles):
    with pytest.raises(GraftDataError) as err:  # the caller's class
        json_loads(text, "where", GraftDataError)
    for needle in needles:
        assert needle in str(err.value), str(err.value)


def test_values_still_parse():
    assert yaml_loads("a: [1, {b: 2024-01-02}]\nc: '" + HUGE + "'", "f") == {
        "a": [1, {"b": __import__("datetime").date(2024, 1, 2)}], "c": HUGE}
    assert json_loads('{"a": [1.5, null, "' + HUGE + '"]}', "f") == {"a": [1.5, None, HUGE]}


def test_calibration_lines(tmp_path):
    from graft.quantize.calibration import _records

    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"text": "hi"}\n{"n": ' + HUGE + "}\n")
    with pytest.raises(GraftConfigError, match=rf"--calibration {calib}:2: the number at column 7"):
        _records(calib)
