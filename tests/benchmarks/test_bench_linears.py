"""`graft bench linears` times every CPU linear path on a model's shapes and writes JSON."""

import json

from graft.cli import main


def test_bench_linears_cli(tiny_llama, tmp_path, capsys):
    out = tmp_path / "linears.json"
    assert main(["bench", "linears", str(tiny_llama), "--rows", "1,3", "--repeats", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["shapes"][0] == [128, 64] and result["shapes"][-1][1] == 64  # qkv, ..., head
    for rows in ("1", "3"):
        per = result["rows"][rows]
        assert per["fp32 F.linear"]["speedup_vs_fp32_f_linear"] == 1.0
        graft_c = [name for name in per if name.startswith("graft C ")]
        for fmt in ("int8", "int4-g32", "bf16"):  # this CPU's path, and AVX2 where it has more
            assert any(name.startswith(f"graft C {fmt} (") for name in graft_c)
        for name in graft_c:
            assert per[name]["us"] > 0 and per[name]["max_rel_diff"] < 1e-5  # vs its dequantized weight
        assert "torch _weight_int8pack_mm" in per
    assert "graft C int4-g64" in capsys.readouterr().out
