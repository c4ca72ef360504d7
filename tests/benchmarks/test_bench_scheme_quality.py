"""`graft bench scheme-quality`: each weight scheme on every linear of an LLM against fp32,
greedy answers and KL of next-token distributions, from the engine's own kernels."""

import json

from graft.cli import main


def test_fp32_against_itself_is_identical_and_int4_a8_is_measured(tiny_llm_factory, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question": "What is two plus two?"}\n\n{"question": "Name a colour."}\n')
    out = tmp_path / "quality.json"
    assert main(["bench", "scheme-quality", str(tiny_llm_factory("llama")), "--schemes", "fp32,int4-a8",
                 "--prompts", str(prompts), "--max-tokens", "6", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["prompts"] == 2 and result["max_tokens"] == 6
    fp32, a8 = result["results"]
    assert fp32 == {"scheme": "fp32", "identical": 1.0, "shared_tokens_mean": 6.0, "kl_mean": 0.0, "kl_max": 0.0}
    assert a8["scheme"] == "int4-g32-a8" and 0.0 <= a8["identical"] <= 1.0
    assert 0.0 < a8["kl_mean"] <= a8["kl_max"]  # the rounding and the 4-bit weights change something
    assert "int4-g32-a8" in capsys.readouterr().out


def test_bad_prompts_and_schemes_are_one_line_errors(tiny_llm_factory, tmp_path, capsys):
    model = str(tiny_llm_factory("llama"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no question"}\n')
    assert main(["bench", "scheme-quality", model, "--prompts", str(bad)]) == 2
    assert f"{bad}:1: need a JSON object with \"question\"" in capsys.readouterr().err
    assert main(["bench", "scheme-quality", model, "--schemes", "int4-a4"]) == 2
    assert "not a weight scheme" in capsys.readouterr().err
