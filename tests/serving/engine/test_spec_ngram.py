"""The n-gram prompt-lookup proposer and the speculation controls (config, per request,
adaptive back-off)."""

import pytest

from graft.errors import GraftConfigError
from graft.serving import EngineConfig, SamplingParams
from graft.serving.engine.spec_decode import controller
from graft.serving.engine.spec_decode.controller import SpecDecoder
from graft.serving.engine.spec_decode.ngram import NgramProposer
from graft.serving.engine.sequence import Sequence


def test_longest_ngram_and_latest_match_win():
    p = NgramProposer(1, 3, 3)
    #            a  b  c  X  a  b  c  Y  . . .  b  c   -> "b c" last seen before "Y"
    tokens = [1, 2, 3, 9, 1, 2, 3, 8, 5, 6, 2, 3]
    assert p.propose(tokens) == [8, 5, 6]
    # a 3-gram match beats a later 2-gram match
    tokens = [7, 2, 3, 4, 4, 4, 9, 2, 3, 5, 7, 2, 3]
    assert p.propose(tokens) == [4, 4, 4]


def test_no_match_limit_and_min_n():
    p = NgramProposer(2, 3, 4)
    assert p.propose([1, 2, 3, 4]) == []  # no earlier occurrence of any suffix 2/3-gram
    assert p.propose([5]) == []
    assert p.propose([1, 2, 7, 8, 9, 1, 2], limit=2) == [7, 8]
    assert p.propose([1, 2, 7, 8, 9, 1, 2], limit=0) == []


def test_repeating_run_proposes_k_tokens():
    p = NgramProposer(2, 2, 5)
    assert p.propose([4, 4, 4]) == [4, 4, 4, 4, 4]
    assert p.propose([1, 2, 1, 2]) == [1, 2, 1, 2, 1]


def test_image_placeholders_are_never_proposed():
    p = NgramProposer(1, 2, 4)
    assert p.propose([3, 4, 5, -1, -1, 6, 3, 4]) == [5]


def test_config_and_request_fields_are_checked():
    with pytest.raises(GraftConfigError, match="EngineConfig.speculative"):
        EngineConfig(speculative="draft")
    with pytest.raises(GraftConfigError, match="ngram_min"):
        EngineConfig(ngram_min=5, ngram_max=3)
    with pytest.raises(GraftConfigError, match="num_speculative_tokens"):
        EngineConfig(num_speculative_tokens=0)
    with pytest.raises(GraftConfigError, match="SamplingParams.speculative"):
        SamplingParams(speculative="yes")
    assert EngineConfig().speculative == "off"


def _seq(params, tokens=(1, 2, 3, 1, 2)):
    return Sequence("r", list(tokens), params, 0)


def test_request_override_and_length_limits():
    off = SpecDecoder(EngineConfig(), max_model_len=64)
    on = SpecDecoder(EngineConfig(speculative="ngram"), max_model_len=64)
    assert off.propose(_seq(SamplingParams()), 100) == []
    assert off.propose(_seq(SamplingParams(speculative="ngram")), 100) == [3, 1, 2, 3]
    assert on.propose(_seq(SamplingParams(speculative="off")), 100) == []
    assert on.propose(_seq(SamplingParams()), budget=3) == [3, 1]  # its own token + 2
    # a step emits up to len(proposal) + 1 tokens: never more than max_tokens allows
    assert on.propose(_seq(SamplingParams(max_tokens=2)), 100) == [3]
    short = SpecDecoder(EngineConfig(speculative="ngram"), max_model_len=7)
    assert short.propose(_seq(SamplingParams()), 100) == [3]  # positions 5 and 6 left


def test_low_acceptance_pauses_speculation():
    # the engine's step cost priors: one failed 4-token verify step alone costs 3 ms, a
    # plain batch-1 token 4.5 ms (tests/serving/engine/test_spec_controller.py: measured costs)
    spec = SpecDecoder(EngineConfig(speculative="ngram"), max_model_len=4096)
    seq = _seq(SamplingParams(max_tokens=4096))
    spec.record(seq, 4, 0)  # one miss: still within LOSS_STEPS
    assert seq.spec.resume_at == 0
    spec.record(seq, 4, 0)
    assert seq.spec.resume_at == seq.num_output_tokens + controller.FIRST_PAUSE
    assert spec.propose(seq, 100) == []
    seq.token_ids += [1, 2] * (controller.FIRST_PAUSE // 2)  # the pause passes
    assert spec.propose(seq, 100) != []
    for _ in range(controller.LOSS_STEPS + 1):
        spec.record(seq, 4, 0)
    assert seq.spec.pause == 4 * controller.FIRST_PAUSE  # doubled twice: the second pause ran
    spec.record(seq, 4, 4)  # good acceptance resets the back-off
    assert seq.spec.pause == controller.FIRST_PAUSE
    assert (spec.proposed, spec.accepted, spec.steps) == (20, 4, 5)


def test_more_decoding_neighbours_need_more_acceptance():
    spec = SpecDecoder(EngineConfig(speculative="ngram"), max_model_len=4096)
    alone, crowded = _seq(SamplingParams(max_tokens=4096)), _seq(SamplingParams(max_tokens=4096))
    for _ in range(controller.LOSS_STEPS + 1):
        spec.record(alone, 4, 1, num_decoding=1)  # 1 token per step pays off alone ...
        spec.record(crowded, 4, 1, num_decoding=8)  # ... not beside 7 plain decodes
    assert alone.spec.resume_at == 0
    assert crowded.spec.resume_at == crowded.num_output_tokens + 8 * controller.FIRST_PAUSE


def test_proposals_are_one_longer_than_recent_acceptance():
    spec = SpecDecoder(EngineConfig(speculative="ngram", num_speculative_tokens=4),
                       max_model_len=4096)
    seq = _seq(SamplingParams(max_tokens=4096), tokens=(1, 2, 3, 4, 5, 6, 1, 2))
    assert spec.propose(seq, 100) == [3, 4, 5, 6]
    spec.record(seq, 4, 0)
    assert spec.propose(seq, 100) == [3]
    spec.record(seq, 1, 1)
    assert spec.propose(seq, 100) == [3, 4]  # average 0.5, rounded up: it can grow again
    for _ in range(4):
        spec.record(seq, 4, 4)
    assert spec.propose(seq, 100) == [3, 4, 5, 6]
