"""The finals' decision: a change is kept only when it beats the default by more than the
spread of the replays; two fresh tunes of one trace decide the same."""

import pytest

from graft.tune.cli import tune, wall_measure
from graft.tune.decide import NO_GAIN, decide, finalist
from graft.tune.search import label
from graft.tune.synth import synth_trace
from graft.tune.trace import read_trace, write_trace


def _points(options: dict, rates, meets=True) -> list[dict]:
    meets = [meets] * len(rates) if isinstance(meets, bool) else meets
    return [{"key": label(options), "options": options, "requests": 9, "repeat": r,
             "summary": {"capacity_tokens_per_s": rate, "tag": (label(options), r)},
             "meets_slo": ok} for r, (rate, ok) in enumerate(zip(rates, meets))]


def test_finalist_median_and_spread():
    f = finalist(_points({"block_size": 32}, [90.8, 80.0, 100.0]))
    assert (f["median"], f["min"], f["max"], f["spread"]) == (90.8, 80.0, 100.0, 20.0)
    assert f["summary"]["tag"] == ("block_size=32", 0)  # the median replay's own numbers
    assert f["meets_slo"] and (f["met"], f["replays"]) == (3, 3)
    assert not finalist(_points({}, [1, 2, 3], [True, False, True]))["meets_slo"]


def test_a_gain_within_the_spread_keeps_the_default():
    # the case: +1.2% where the replays of one configuration spread 10%
    d = decide([finalist(_points({}, [89.7, 85.0, 94.0])),
                finalist(_points({"block_size": 32}, [90.8, 88.0, 93.0]))])
    assert d.chosen["key"] == "default" and d.noise == pytest.approx(9.0)
    assert d.reason.startswith(NO_GAIN) and "block_size=32, +1.1 tok/s" in d.reason


def test_a_gain_beyond_the_spread_is_chosen():
    d = decide([finalist(_points({}, [50.0, 48.0, 52.0])),
                finalist(_points({"max_num_seqs": 8}, [51.0, 47.0, 55.0])),
                finalist(_points({"speculative": "ngram"}, [100.0, 98.0, 104.0]))])
    assert d.chosen["key"] == "speculative=ngram" and d.noise == pytest.approx(8.0)
    assert "+50.0 tok/s over the default's median, more than the spread of 8.0" in d.reason
    # the same gain is noise on a machine whose replays spread wider than it
    wide = decide([finalist(_points({}, [50.0, 10.0, 120.0])),
                   finalist(_points({"speculative": "ngram"}, [100.0, 98.0, 104.0]))])
    assert wide.chosen["key"] == "default" and wide.reason.startswith(NO_GAIN)


def test_slo_in_every_replay():
    flaky_default = finalist(_points({}, [99.0, 100.0, 101.0], [True, False, True]))
    steady = finalist(_points({"block_size": 32}, [60.0, 61.0, 62.0]))
    d = decide([flaky_default, steady])
    assert d.chosen["key"] == "block_size=32"
    assert "default missed the SLO in 1 of 3 replays" in d.reason
    # a faster candidate that also missed once is not eligible either
    fast_flaky = finalist(_points({"max_num_seqs": 8}, [200.0, 201.0, 202.0], [True, True, False]))
    assert decide([flaky_default, fast_flaky, steady]).chosen["key"] == "block_size=32"
    assert decide([flaky_default, fast_flaky]).chosen is None


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "chat.jsonl"
    return read_trace(write_trace(path, synth_trace("chat", n=6, seed=4, rate=20.0)))


def test_two_fresh_tunes_decide_the_same(tiny_llama, chat_trace, tmp_path):
    """Real time on this machine: options that cannot matter for 6 short requests (room for
    256 sequences or 8192 batched tokens where 64 and 2048 already hold them all) must not
    win, however the replays' speed wanders; both tunes write the same file body."""
    fixed = {"num_kv_blocks": 64, "max_model_len": 256}
    cands = [{}, {"max_num_seqs": 256}, {"max_num_batched_tokens": 8192}]
    bodies, logs = [], []
    for run in range(2):
        out, log = tmp_path / f"tuned{run}.yaml", []
        outcome = tune(chat_trace, tiny_llama, {"ttft_p99_ms": 600000}, out,
                       wall_measure(tiny_llama, chat_trace, fixed, speed=100.0, log=log.append),
                       cands, {"run": run}, fixed=fixed, repeats=5, log=log.append)
        assert outcome.best["key"] == "default" and outcome.reason.startswith(NO_GAIN)
        assert [f["replays"] for f in outcome.finals] == [5, 5, 5]
        warm = [i for i, line in enumerate(log) if line.startswith("warm-up: the default")]
        measured = [i for i, line in enumerate(log) if " @ 6 req: " in line]
        assert len(warm) == 1 and warm[0] < measured[0] and len(measured) == 15
        assert any(line.startswith("decision: " + NO_GAIN) for line in log)
        text = out.read_text()
        assert f"# decision: {NO_GAIN}" in text
        bodies.append([line for line in text.splitlines() if not line.startswith("#")])
        logs.append(log)
    assert bodies[0] == bodies[1] and bodies[0][0] == f"path: {tiny_llama}"
