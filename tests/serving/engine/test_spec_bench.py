"""`graft bench engine --speculative ngram` runs end to end on a tiny checkpoint."""

import json

from graft.cli import main


def test_bench_engine_speculative(tiny_llama, tmp_path, capsys):
    out = tmp_path / "spec.json"
    rc = main(["bench", "engine", str(tiny_llama), "--speculative", "ngram",
               "--decode-tokens", "6", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    runs = {(r["workload"], r["batch"]): r for r in result["runs"]}
    assert set(runs) == {("copy", 1), ("copy", 8), ("open", 1), ("open", 8)}
    for r in runs.values():
        assert r["identical_tokens"] and r["tok_s_on"] > 0 and r["cpu_speedup"] > 0
    assert "tokens/verify step" in capsys.readouterr().out
