"""`graft bench row-ops-micro` times the decode step's C attention, silu_mul and argmax alone,
and with --baseline-lib the same calls in another build, whose outputs it compares."""

import json

import pytest
import torch

from graft.cli import main
from graft.kernels import cpu_ops, reference

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
SMALL = ["--seqs", "3", "--context", "40", "--heads", "4,2", "--intermediate", "64", "--vocab", "100",
         "--repeats", "1", "--min-seconds", "0.001"]


def test_times_each_op_and_a_baseline_build_beside(tmp_path, capsys):
    out = tmp_path / "row_ops.json"
    this_build = cpu_ops._lib()._name  # the same library as its own baseline
    assert main(["bench", "row-ops-micro", *SMALL, "--baseline-lib", this_build, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["op"] for r in result["results"]] == ["attention", "silu_mul", "argmax"]
    for r in result["results"]:
        assert r["us"] > 0 and r["baseline_us"] > 0 and r["max_abs_diff_vs_baseline"] == 0.0
        assert r["speedup_vs_baseline"] == pytest.approx(r["baseline_us"] / r["us"])
    assert "x baseline" in capsys.readouterr().out


def test_the_timed_calls_compute_the_ops():
    """The benchmark's argument lists are the kernels' real calls: run once, each output is
    what the reference gives for the same inputs."""
    import argparse

    from graft.benchmarks import row_ops_micro

    parser = argparse.ArgumentParser()
    row_ops_micro.add_arguments(parser)
    args = parser.parse_args(SMALL)
    cases, x = row_ops_micro._cases(args, torch)
    for call, _, _ in cases.values():
        call(cpu_ops._lib())
    want = reference.paged_attention_decode(x["q"], x["k"], x["v"], x["tables"], x["lens"],
                                            args.head_dim ** -0.5)
    torch.testing.assert_close(cases["attention"][1], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cases["silu_mul"][1], reference.silu_mul(x["gate_up"], args.intermediate),
                               rtol=1e-5, atol=1e-5)
    assert torch.equal(cases["argmax"][1], x["logits"].argmax(dim=-1))


def test_bad_heads_say_which(capsys):
    assert main(["bench", "row-ops-micro", *SMALL, "--heads", "5,2"]) == 2
    assert "query heads a multiple of the kv heads" in capsys.readouterr().err
