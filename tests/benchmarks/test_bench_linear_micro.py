"""`graft bench linear-micro` times graft's C linear per format, shape and row count, and
checks each result against the dequantized reference; --baseline-lib times another build."""

import json

import pytest
import torch

from graft.cli import main
from graft.kernels import cpu_ops

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason=str(cpu_ops.unavailable_reason()))
QUICK = ["--repeats", "1", "--min-seconds", "0.001"]


def test_linear_micro_writes_rates_and_errors(tmp_path, capsys):
    out = tmp_path / "micro.json"
    assert main(["bench", "linear-micro", "--formats", "int8,int4-g64", "--shapes", "64x96,32x128",
                 "--rows", "1,5", *QUICK, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    # int4-g64 does not divide 96: that shape is skipped with the reason, the rest measured
    assert [(r["format"], r["out"], r["in"], r["rows"]) for r in rows] == [
        ("int8", 64, 96, 1), ("int8", 64, 96, 5), ("int8", 32, 128, 1), ("int8", 32, 128, 5),
        ("int4-g64", 32, 128, 1), ("int4-g64", 32, 128, 5)]
    for r in rows:
        assert r["us"] > 0 and r["max_rel_diff"] < 1e-5
        assert r["gmac_s"] == pytest.approx(r["rows"] * r["out"] * r["in"] / r["us"] / 1e3)
        assert "speedup_vs_baseline" not in r
    assert "int4 group size 64 does not divide" in capsys.readouterr().out


def test_isa_cap_holds_for_the_baseline_build_and_is_lifted_after(tmp_path):
    """--isa caps the baseline build as well as this one (else old and new run different
    paths), and neither cap outlives the command."""
    import ctypes
    import shutil

    from graft.kernels import cpu_quant

    before = cpu_quant.isa()
    copy = tmp_path / "other.so"
    shutil.copy(cpu_ops._lib()._name, copy)
    other = ctypes.CDLL(str(copy))  # the handle the command's dlopen of this path shares
    other.graft_quant_cap_isa(1)  # avx2: left as the command found it, not lifted to the top
    out = tmp_path / "micro.json"
    assert main(["bench", "linear-micro", "--formats", "fp32", "--shapes", "32x64", "--rows", "2",
                 *QUICK, "--isa", "portable", "--baseline-lib", str(copy), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["isa"] == "portable" and result["baseline_isa"] == "portable"
    assert cpu_quant.isa() == before and other.graft_quant_isa() == min(1, cpu_quant.ISA_NAMES.index(before))


def test_linear_micro_times_a_baseline_build_beside(tmp_path):
    out = tmp_path / "micro.json"
    this_build = cpu_ops._lib()._name  # the same library as its own baseline
    assert main(["bench", "linear-micro", "--formats", "bf16", "--shapes", "32x64", "--rows", "3",
                 *QUICK, "--baseline-lib", this_build, "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    assert r["baseline_us"] > 0 and r["baseline_max_rel_diff"] < 1e-5
    assert r["speedup_vs_baseline"] == pytest.approx(r["baseline_us"] / r["us"])


@pytest.mark.parametrize("flag,value,message", [
    ("--shapes", "64by96", "--shapes: '64by96' is not OUTxIN"),
    ("--baseline-lib", "/nonexistent/lib.so", "--baseline-lib: cannot use /nonexistent/lib.so"),
    ("--isa", "sse", "--isa: 'sse' is not one of portable"),
    ("--formats", "int3", "--formats='int3' is not a weight scheme"),
    ("--threads", "0", "--threads: 0 is out of range: use >= 1"),
])
def test_linear_micro_bad_arguments_say_which(flag, value, message, capsys):
    assert main(["bench", "linear-micro", "--shapes", "32x64", "--rows", "1", *QUICK, flag, value]) == 2
    assert message in capsys.readouterr().err


def test_threads_split_the_call_and_are_recorded(tmp_path):
    """--threads runs each call on that many threads (the engine's linears run on all of
    them): the same results as one, the count in the JSON."""
    out = tmp_path / "micro.json"
    assert main(["bench", "linear-micro", "--formats", "int4-g32,int8", "--shapes", "256x128",
                 "--rows", "1,3", *QUICK, "--threads", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["threads"] == 2 and len(result["results"]) == 4
    assert all(r["max_rel_diff"] < 1e-5 for r in result["results"])


def test_torch_is_timed_beside_on_the_same_weights(tmp_path, capsys):
    """--torch: oneDNN's prepacked linear on the dequantized weight, its time over graft's."""
    from graft.kernels import cpu_linear

    out = tmp_path / "micro.json"
    assert main(["bench", "linear-micro", "--formats", "int8", "--shapes", "48x64", "--rows", "4",
                 *QUICK, "--torch", "--out", str(out)]) == 0
    (r,) = json.loads(out.read_text())["results"]
    if cpu_linear.unavailable_reason(torch.float32):
        assert r["torch_unavailable"] and "torch:" in capsys.readouterr().out
    else:
        assert r["torch_us"] > 0 and r["speedup_vs_torch"] == pytest.approx(r["torch_us"] / r["us"])
        assert "x torch (" in capsys.readouterr().out


def test_bf16_rows_take_the_bf16_in_bf16_out_call(tmp_path, capsys):
    """--bf16-rows: bf16 weights get bf16 rows and give bf16 out, within a bf16 rounding of
    the reference; other formats keep fp32 rows. A build without that call says so."""
    from graft.kernels import cpu_quant

    out = tmp_path / "micro.json"
    code = main(["bench", "linear-micro", "--formats", "bf16,int8", "--shapes", "48x64", "--rows", "9",
                 *QUICK, "--bf16-rows", "--out", str(out)])
    if not cpu_quant._bf16_dot_built():
        assert code == 2 and "--bf16-rows" in capsys.readouterr().err
        return
    assert code == 0
    bf16, int8 = json.loads(out.read_text())["results"]
    assert bf16["bf16_rows"] and bf16["max_rel_diff"] < 2 ** -7
    assert not int8["bf16_rows"] and int8["max_rel_diff"] < 1e-5
