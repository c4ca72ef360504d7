"""`graft bench prefill-attention` times the C prefill attention against the reference on the
same paged inputs and checks that the two agree."""

import json

import pytest
import torch

from graft.cli import main
from graft.kernels import cpu_ops, reference

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
SMALL = ["--seqs", "2", "--prompt-len", "40", "--heads", "4,2", "--head-dim", "32",
         "--repeats", "1", "--threads", "1"]


@pytest.mark.parametrize("cached", [0, 24])
def test_times_both_paths_and_writes_json(tmp_path, capsys, cached):
    out = tmp_path / "prefill.json"
    args = [*SMALL, "--cached", str(cached), "--out", str(out)]
    assert main(["bench", "prefill-attention", *args]) == 0
    r = json.loads(out.read_text())
    assert r["c_ms"] > 0 and r["reference_ms"] > 0 and r["cached"] == cached
    assert r["speedup_vs_reference"] == pytest.approx(r["reference_ms"] / r["c_ms"])
    assert r["max_abs_diff_vs_reference"] < 1e-5
    # 2 prompts of 40 queries over 40 + cached keys: query i sees cached + i + 1 of them
    pairs = 2 * sum(cached + i + 1 for i in range(40))
    assert r["c_gflop_s"] == pytest.approx(4 * 4 * 32 * pairs / (r["c_ms"] / 1e3) / 1e9)
    assert "C / reference" in capsys.readouterr().out


def test_the_timed_inputs_are_a_real_paged_step():
    """The benchmark's inputs hold each prompt's blocks under a shuffled table: the C kernel and
    the reference compute the same attention from them."""
    import argparse

    from graft.benchmarks import prefill_attention

    parser = argparse.ArgumentParser()
    prefill_attention.add_arguments(parser)
    args = parser.parse_args([*SMALL, "--cached", "8"])
    q, k, v, tables, cu, lens, scale = prefill_attention.paged_inputs(args, torch)
    assert sorted(tables.flatten().tolist()) == list(range(k.shape[0]))
    assert lens.tolist() == [48, 48] and cu.tolist() == [0, 40, 80]
    got = cpu_ops.paged_attention_prefill(q, k, v, tables, cu, lens, scale)
    want = reference.paged_attention_prefill(q, k, v, tables, cu, lens, scale)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_bad_heads_is_a_one_line_error(capsys):
    assert main(["bench", "prefill-attention", *SMALL, "--heads", "5,2"]) == 2
    assert "--heads" in capsys.readouterr().err
