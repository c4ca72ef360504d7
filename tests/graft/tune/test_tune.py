"""graft tune on a tiny random LLM. The choice is tested with a step clock (every engine step
costs 10 ms of replay time), so it never depends on this machine's speed: on a copy-heavy
trace n-gram speculation needs fewer steps per token, so only it meets a TPOT bound the
default (one token per step: 10 ms) misses."""

import argparse

import pytest

from graft.cli import main
from graft.tune.cli import tune
from graft.tune.replay import StepClock, load_engine, replay
from graft.tune.search import candidates, label, search_space
from graft.tune.state import state_path
from graft.tune.synth import synth_trace
from graft.tune.trace import read_trace, write_trace

FIXED = {"num_kv_blocks": 128, "max_model_len": 512}
NGRAM = {"speculative": "ngram", "num_speculative_tokens": 4}
SLO = {"tpot_p99_ms": 9.5}  # the default's TPOT is exactly one 10 ms step per token


@pytest.fixture(scope="module")
def copy_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "copy.jsonl"
    return read_trace(write_trace(path, synth_trace("copy-heavy", n=9, seed=1, rate=50.0)))


def step_measure(model, records, calls):
    def measure(options, n):
        calls.append((label(options), n))
        engine = load_engine(model, {**FIXED, **options})
        return replay(engine, records[:n], clock=StepClock(0.01), warmup=False)

    return measure


CANDS = [{}, NGRAM, {"max_num_seqs": 8}, {"max_num_batched_tokens": 256}]


def test_tune_picks_ngram_on_copy_heavy(tiny_llama, copy_trace, tmp_path):
    calls = []
    out = tmp_path / "tuned.yaml"
    outcome = tune(copy_trace, tiny_llama, SLO, out, step_measure(tiny_llama, copy_trace, calls),
                   CANDS, {"test": 1}, fixed=FIXED, log=lambda *_: None)
    assert outcome.default["summary"]["tpot_ms"]["p99"] == pytest.approx(10.0)
    assert not outcome.default["meets_slo"]
    assert outcome.best["key"] == label(NGRAM)
    assert outcome.best["summary"]["steps"] < outcome.default["summary"]["steps"]
    assert out.with_suffix(".png").stat().st_size > 0
    # a warm-up replay of the default first (not a point), then every candidate on a prefix
    assert calls[0] == ("default", 8) and len(outcome.points) == len(calls) - 1
    assert [n for _, n in calls[1:len(CANDS) + 1]] == [8] * len(CANDS)
    # only the finalists (and the default) on all 9, 3 times each, interleaved: A B A B A B
    finals = [key for key, n in calls if n == 9]
    per = len(outcome.finals)
    assert 2 <= per <= 3 and finals == finals[:per] * 3 and finals[0] == "default"
    assert outcome.finals[0] is outcome.default
    # the header: the rule, the decision, each finalist's median and spread
    header = [line for line in out.read_text().splitlines() if line.startswith("#")]
    text = "\n".join(header)
    assert "more than the largest spread" in text and "decision: the default missed the SLO" in text
    for f in outcome.finals:
        assert f"#   {f['key']}: {f['median']:.1f} tok/s median [{f['min']:.1f}-" in text
        assert f"spread {f['spread']:.1f}" in text
    # serve's own parser reads the file: path, the fixed options and the winner's
    from graft.serving import EngineConfig
    from graft.serving.http import serve_cli
    from graft.serving.http.serve_config import parse_args

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parse_args(parser, ["--config", str(out)])
    config = EngineConfig.from_args(args)
    assert args.path == str(tiny_llama)
    assert (config.speculative, config.num_speculative_tokens) == ("ngram", 4)
    assert (config.num_kv_blocks, config.max_model_len) == (128, 512)


def test_resume_replays_no_finished_point(tiny_llama, copy_trace, tmp_path):
    out = tmp_path / "tuned.yaml"
    first, second = [], []
    measure = step_measure(tiny_llama, copy_trace, first)

    def interrupted(options, n):
        if len(first) == 4:
            raise KeyboardInterrupt  # Ctrl-C during the fourth replay after the warm-up
        return measure(options, n)

    with pytest.raises(KeyboardInterrupt):
        tune(copy_trace, tiny_llama, SLO, out, interrupted, CANDS, {"test": 1},
             log=lambda *_: None)
    assert len(state_path(out).read_text().splitlines()) == 1 + 3  # fingerprint + 3 points
    outcome = tune(copy_trace, tiny_llama, SLO, out, step_measure(tiny_llama, copy_trace, second),
                   CANDS, {"test": 1}, log=lambda *_: None)
    # each run warms up once (its first call), then nothing finished is measured twice
    assert first[0] == second[0] == ("default", 8) and not set(first[1:]) & set(second[1:])
    assert outcome.replayed == len(second) - 1
    assert len(outcome.points) == len(first) - 1 + len(second) - 1
    assert outcome.best["key"] == label(NGRAM)
    # another SLO over the same measurements: judged anew, nothing replayed again (nor warmed)
    third = []
    loose = tune(copy_trace, tiny_llama, {"tpot_p99_ms": 20.0}, out,
                 step_measure(tiny_llama, copy_trace, third), CANDS, {"test": 1},
                 log=lambda *_: None)
    assert loose.default["meets_slo"] and third == []
    # another tune's settings: the state file is refused, not mixed in
    from graft.errors import GraftConfigError

    with pytest.raises(GraftConfigError, match="other settings"):
        tune(copy_trace, tiny_llama, SLO, out, measure, CANDS, {"test": 2}, log=lambda *_: None)


def test_nothing_meets_the_slo_writes_nothing(tiny_llama, copy_trace, tmp_path):
    out = tmp_path / "tuned.yaml"
    outcome = tune(copy_trace, tiny_llama, {"tpot_p99_ms": 0.001}, out,
                   step_measure(tiny_llama, copy_trace, []), [{}, NGRAM], {"test": 1},
                   log=lambda *_: None)
    assert outcome.best is None and not out.exists()


def test_search_space_and_candidates():
    space = search_space({"block_size": 16}, images=False, device="cpu", quant=[])
    assert "block_size" not in space and "encoder_cache_mb" not in space
    assert space["max_prefill_tokens"] == [{"max_prefill_tokens": 128}, {"max_prefill_tokens": 1024}]
    cands = candidates(space, 20, seed=0)
    assert cands[0] == {} and NGRAM in cands and len(cands) == 20
    assert len({label(c) for c in cands}) == 20
    assert candidates(space, 20, seed=0) == cands
    fixed_k = search_space({"num_speculative_tokens": 3}, images=True, device="cuda", quant=[])
    assert fixed_k["speculative"] == [{"speculative": "ngram"}]
    assert "kv_cache_dtype" not in fixed_k and "encoder_cache_mb" in fixed_k


def test_cli_end_to_end(tiny_llama, tmp_path, capsys):
    """Real time (the CLI's clock): an SLO any machine meets, and one none can."""
    trace = tmp_path / "chat.jsonl"
    assert main(["tune", "synth", "--profile", "chat", "--n", "6", "--out", str(trace)]) == 0
    out = tmp_path / "tuned.yaml"
    common = [str(trace), "--model", str(tiny_llama), "--candidates", "2", "--speed", "100",
              "--num-kv-blocks", "64", "--max-model-len", "256"]
    assert main(["tune", *common, "--slo", "ttft_p99_ms=600000", "--out", str(out)]) == 0
    assert out.is_file() and state_path(out).is_file()
    assert main(["tune", *common, "--slo", "ttft_p99_ms=0.001",
                 "--out", str(tmp_path / "never.yaml")]) == 1
    assert "no configuration meets the SLO" in capsys.readouterr().out
    assert not (tmp_path / "never.yaml").exists()


def test_quality_floor_picks_front_points(tmp_path):
    import json

    from graft.errors import GraftConfigError
    from graft.tune.search import pareto_choices

    groups = {"mlp": ["model.layers.0.mlp.down_proj"], "attn": ["model.layers.0.self_attn.o_proj"]}
    report = {"baseline": {"key": "fp32", "quality": 0.80}, "groups": groups, "front": [
        {"key": "fp32", "quality": 0.80, "assignment": {}},
        {"key": "a", "quality": 0.795, "assignment": {"mlp": "int8", "attn": "int8"}},
        {"key": "b", "quality": 0.70, "assignment": {"mlp": "int4-g32"}}]}
    path = tmp_path / "pareto.json"
    path.write_text(json.dumps(report))
    (config,) = pareto_choices(path, 0.01)  # b is 0.10 below fp32: left out
    assert config["default"] == "int8" and config["modules"] == {}
    from graft.serving import EngineConfig

    assert EngineConfig(quantization=config).quant_config is not None  # the engine takes it
    assert len(pareto_choices(path, 0.2)) == 2
    space = search_space({}, images=False, device="cpu", quant=[config])
    assert space["quantization"] == [{"quantization": config}]
    path.write_text("{}")
    with pytest.raises(GraftConfigError, match="not a pareto.json"):
        pareto_choices(path, 0.01)
