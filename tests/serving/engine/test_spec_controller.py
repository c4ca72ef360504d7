"""The adaptive speculation controller on measured step costs: an injected cost table (steps
fed to the engine's StepCostModel with made-up seconds), never the machine's speed."""

import pytest

from graft.serving import EngineConfig, SamplingParams
from graft.serving.engine.sequence import Sequence
from graft.serving.engine.spec_decode import controller
from graft.serving.engine.spec_decode.controller import SpecDecoder, speculation_gain
from graft.serving.engine.step_cost import StepCostModel


def _costs(plain: tuple[float, float], verify: tuple[float, float]) -> StepCostModel:
    """A cost model that has seen decode-phase steps costing a + b * rows seconds."""
    cost = StepCostModel()
    for rows in (1, 2, 4, 8, 12, 16):
        cost.observe_step(0, rows, plain[0] + plain[1] * rows)
        cost.observe_step(rows + 1, 0, verify[0] + verify[1] * (rows + 1), verify_rows=rows + 1)
    return cost


CHEAP = _costs(plain=(0.010, 0.001), verify=(0.011, 0.001))  # verify ~ a plain step
DEAR = _costs(plain=(0.010, 0.001), verify=(0.025, 0.002))  # verify ~2.3x at batch 1


def test_cost_model_separates_plain_and_verify_steps():
    cost = _costs(plain=(0.010, 0.001), verify=(0.025, 0.002))
    assert cost.decode_step_seconds(1, verifying=False) == pytest.approx(0.011, rel=0.02)
    assert cost.decode_step_seconds(5, verifying=True) == pytest.approx(0.035, rel=0.02)
    # prompt chunks are not decode-phase steps: they leave both fits alone
    before = cost.decode_step_seconds(5, verifying=True)
    cost.observe_step(300, 2, 9.0)
    assert cost.decode_step_seconds(5, verifying=True) == before


# on CPU a verify step's fixed part (the op-by-op path) dominates and rows are cheap
SHARED = _costs(plain=(0.010, 0.0005), verify=(0.020, 0.0003))


def pays(accepted, proposed, decoding, cost, step_proposals=None):
    return speculation_gain(accepted, proposed, decoding,
                            proposed if step_proposals is None else step_proposals, cost) >= 0


def test_the_measured_costs_decide_what_pays():
    # one accepted token of four at batch 1: pays when verifying is cheap, not when it is dear
    assert pays(1, 4, 1, CHEAP) and not pays(1, 4, 1, DEAR)
    # 2.3x dearer: (1 + a) * 11 ms >= 35 ms needs a >= 2.2
    assert pays(3, 4, 1, DEAR) and not pays(2, 4, 1, DEAR)
    # beside 7 plain decodes the verify step slows all 8: the same acceptance stops paying
    assert not pays(1, 4, 8, CHEAP)
    # 3 of 4 accepted at batch 8: alone the sequence pays the whole switch to the verify
    # path and loses; when all 8 verify together they share it and win
    assert not pays(3, 4, 8, SHARED) and pays(3, 4, 8, SHARED, step_proposals=32)
    assert speculation_gain(0, 4, 1, 4, SHARED) == pytest.approx(
        -(SHARED.decode_step_seconds(5, True) - SHARED.decode_step_seconds(1, False)))


def _run(spec: SpecDecoder, accept, max_tokens: int = 2000) -> int:
    """Decode one sequence of a repeating text to max_tokens output tokens; `accept(k)` says
    how many of k proposals match. Returns the number of verify steps."""
    seq = Sequence("r", [1, 2, 3, 4] * 4, SamplingParams(max_tokens=max_tokens), 0)
    verify_steps = 0
    while seq.num_output_tokens < max_tokens:
        draft = spec.propose(seq, budget=100)
        if not draft:
            seq.token_ids.append(seq.token_ids[-4])
            continue
        ok = accept(len(draft))
        seq.token_ids += [seq.token_ids[-4 + (i % 4)] for i in range(ok + 1)]
        spec.record(seq, len(draft), ok)
        verify_steps += 1
    return verify_steps


def test_copy_heavy_keeps_speculating_and_non_copying_stops():
    config = EngineConfig(speculative="ngram", num_speculative_tokens=4)
    copying = SpecDecoder(config, 4096, DEAR)
    steps = _run(copying, accept=lambda k: k)  # every proposal accepted
    assert steps >= 2000 // 5 - 1 and copying.accepted == copying.proposed  # never paused
    never = SpecDecoder(config, 4096, DEAR)
    steps = _run(never, accept=lambda k: 0)
    # LOSS_STEPS + 1 verify steps per probe; pauses of 16, 32, ... 512 tokens, then 512 each
    probes = 1 + 5 + 2000 // controller.MAX_PAUSE
    per_probe = controller.LOSS_STEPS + 1
    assert steps <= per_probe * probes
    # half of the tokens accepted: pays when verifying is cheap, not when it is dear
    assert _run(SpecDecoder(config, 4096, CHEAP), accept=lambda k: k // 2) > 300
    assert _run(SpecDecoder(config, 4096, DEAR), accept=lambda k: k // 2) <= 3 * per_probe * probes


def test_a_copying_sequence_rides_over_a_miss():
    spec = SpecDecoder(EngineConfig(speculative="ngram"), 4096, DEAR)
    seq = Sequence("r", [1, 2, 3, 4] * 4, SamplingParams(max_tokens=4096), 0)
    for accepted in (4, 4, 4, 0, 4, 4, 0, 4):
        spec.record(seq, 4, accepted)
    assert seq.spec.resume_at == 0  # banked credit covered each miss
    for _ in range(controller.CREDIT_STEPS + controller.LOSS_STEPS + 1):
        spec.record(seq, 4, 0)  # the copy ends: credit spent, then the loss limit
    assert seq.spec.resume_at > 0


def test_engine_feeds_its_step_costs_to_the_controller(tiny_llama):
    from graft.serving import Engine

    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=64))
    assert engine.spec.cost is engine.cost
    params = SamplingParams(temperature=0.0, max_tokens=24, speculative="ngram", ignore_eos=True)
    engine.generate(prompt_token_ids=[[5, 6, 7, 8] * 6], sampling_params=params)
    assert engine.spec.steps > 0 and len(engine.cost._verify._points) == engine.spec.steps


def test_failed_first_probes_close_the_gate_for_new_sequences_until_one_pays():
    spec = SpecDecoder(EngineConfig(speculative="ngram"), 4096, DEAR)

    def fresh(name):  # a sequence whose own tokens repeat: it has proposals to make
        return Sequence(name, [1, 2, 3, 4] * 4, SamplingParams(max_tokens=4096), 0)

    for name in ("a", "b"):  # two sequences in a row pause on their first probe, at batch 8
        seq = fresh(name)
        assert spec.propose(seq, budget=100)
        for _ in range(controller.LOSS_STEPS + 1):
            spec.record(seq, 4, 0, num_decoding=8)
        assert seq.spec.resume_at > 0
    late = fresh("c")  # has not probed: starts paused, as if its own first probe had failed
    assert spec.propose(late, budget=100) == []
    assert late.spec.resume_at == controller.FIRST_PAUSE * 8
    payer = Sequence("d", [1, 2, 3, 4] * 4, SamplingParams(max_tokens=4096), 0)
    payer.spec = controller.SpecState()  # one that probed before the gate closed
    for _ in range(controller.CREDIT_STEPS + 2):
        spec.record(payer, 4, 4)  # copies: its speculation pays, the gate opens again
    assert spec.propose(fresh("e"), budget=100)
