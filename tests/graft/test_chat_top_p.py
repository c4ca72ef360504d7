"""`graft chat --top-p`: ranged, and it reaches every backend (HF on a run dir and on a plain
LLM dir, graft's engine): a tiny nucleus keeps only the likeliest token, so sampling at
temperature 1 gives the greedy answer."""

import pytest

from graft.cli import main
from tests.graft.cli_asserts import fails as _fails


def _answer(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out.strip()


def test_top_p_range(tiny_run_dir, capsys):
    for bad in ("0", "1.5", "-0.1"):
        _fails(capsys, ["chat", str(tiny_run_dir), "hi", "--top-p", bad],
               f"argument --top-p: {bad} is out of range: use 0.0 < value <= 1.0")
    _fails(capsys, ["chat", str(tiny_run_dir), "hi", "--top-p", "most"],
           "argument --top-p: 'most' is not a number")


@pytest.mark.parametrize("target,extra", [("run", []), ("llm", []), ("run", ["--quantization", "fp32"])],
                         ids=["hf-run-dir", "hf-llm-dir", "engine"])
def test_top_p_reaches_the_backend(target, extra, tiny_run_dir, tiny_llama, capsys):
    path = str(tiny_run_dir if target == "run" else tiny_llama)
    base = ["chat", path, "Tell me a story.", "--max-new-tokens", "12", *extra]
    greedy = _answer(capsys, base)
    narrow = _answer(capsys, base + ["--temperature", "1", "--top-p", "1e-9", "--seed", "3"])
    assert narrow == greedy
    # the whole distribution at a high temperature: some seed leaves the greedy path
    wide = {_answer(capsys, base + ["--temperature", "2", "--top-p", "1", "--seed", str(s)])
            for s in range(3)}
    assert wide - {greedy}
