"""NaN and infinity are refused by every numeric check (flags, spec fields, REPL /set, SLO
bounds, quantize goals): NaN fails every comparison and inf passes a lower bound, so a range
test alone would let them through to a hang, a NaN loss or garbage output."""

import argparse
import io

import pytest

from graft.chat_cli import Conversation, repl
from graft.cli_types import number_in
from graft.errors import GraftConfigError
from graft.spec import GraftSpec
from tests.graft.cli_asserts import fails

NON_FINITE = ["nan", "inf", "-inf", "NaN", "Infinity"]


@pytest.mark.parametrize("bounds", [{}, {"low": 0.0}, {"low": 0.0, "low_open": True},
                                    {"high": 2.0}, {"low": 0.0, "high": 2.0}])
@pytest.mark.parametrize("text", NON_FINITE)
def test_number_in_refuses_non_finite_whatever_its_range(bounds, text):
    with pytest.raises(argparse.ArgumentTypeError, match="is not a finite number"):
        number_in(float, **bounds)(text)
    assert number_in(float, **bounds)("1.5") == 1.5  # a finite value in range still passes


@pytest.mark.parametrize("argv, flag", [
    (["chat", "RUN", "hi", "--temperature", "{v}"], "--temperature"),
    (["chat", "RUN", "hi", "--top-p", "{v}"], "--top-p"),
    (["tune", "t.jsonl", "--model", "M", "--slo", "ttft_p99_ms=9", "--out", "o.yaml",
      "--speed", "{v}"], "--speed"),
    (["tune", "t.jsonl", "--model", "M", "--slo", "ttft_p99_ms=9", "--out", "o.yaml",
      "--budget-minutes", "{v}"], "--budget-minutes"),
    (["tune", "synth", "--profile", "chat", "--out", "x.jsonl", "--rate", "{v}"], "--rate"),
    (["quantize", "RUN", "--tasks", "t", "--out", "q", "--max-accuracy-drop", "{v}"],
     "--max-accuracy-drop"),
    (["quantize", "RUN", "--tasks", "t", "--out", "q", "--target-speedup", "{v}"],
     "--target-speedup"),
    (["quantize", "RUN", "--tasks", "t", "--out", "q", "--heldout-fraction", "{v}"],
     "--heldout-fraction"),
    (["eval", "--endpoint", "http://127.0.0.1:1/v1", "--tasks", "t", "--timeout", "{v}"],
     "--timeout"),
    (["fleet", "M", "--startup-timeout-s", "{v}"], "--startup-timeout-s"),
    (["bench", "fleet", "M", "--startup-timeout-s", "{v}"], "--startup-timeout-s"),
])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_flags_refuse_non_finite(capsys, argv, flag, value):
    fails(capsys, [a.replace("{v}", value) for a in argv],
          f"argument {flag}: '{value}' is not a finite number")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_slo_bound_must_be_finite(tmp_path, capsys, value):
    fails(capsys, ["tune", str(tmp_path / "t.jsonl"), "--model", str(tmp_path), "--slo",
                   f"ttft_p99_ms={value}", "--out", str(tmp_path / "o.yaml")],
          f"--slo 'ttft_p99_ms={value}': '{value}' is not a finite number")


@pytest.mark.parametrize("field", ["lr", "weight_decay", "warmup_ratio", "max_grad_norm"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "NaN", "inf"])
def test_spec_float_fields_must_be_finite(field, value):
    raw = {"encoder": {"kind": "timm"}, "llm": {"path": "/llm"}, "train": {field: value}}
    with pytest.raises(GraftConfigError, match=rf"train\.{field}=\S+: must be a finite number"):
        GraftSpec.from_dict(raw)


def test_train_set_lr_inf_is_one_line(tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text("encoder: {kind: timm}\nllm: {path: /llm}\n")
    fails(capsys, ["train", str(spec), "--set", "train.lr=inf", "--dry-run"],
          "train.lr=inf: must be a finite number, > 0 and <= 10")


@pytest.mark.parametrize("command", ["/set temperature nan", "/set top_p nan",
                                     "/set temperature inf"])
def test_repl_set_refuses_non_finite_and_goes_on(command):
    options = argparse.Namespace(temperature=0.0, top_p=1.0, max_new_tokens=8, seed=None,
                                 verbose=False)
    answered = []
    out = io.StringIO()
    assert repl(lambda m, i, on_text=None: answered.append(1) or "ok", Conversation(), [],
                io.StringIO(f"{command}\nhi\n"), out, options) == 0
    assert "is not a finite number" in out.getvalue() and answered == [1]
    assert (options.temperature, options.top_p) == (0.0, 1.0)


@pytest.mark.parametrize("kind", ["drop", "speedup", "bytes"])
def test_quantize_goal_must_be_finite(kind):
    from graft.quantize.pareto import Goal

    with pytest.raises(GraftConfigError, match="must be a finite number"):
        Goal(kind, float("nan"))
