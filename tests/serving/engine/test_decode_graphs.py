"""The static-buffer decode path behind the CUDA graphs, run without capture on the CPU:
padded batch sizes, harmless spare rows and stale block-table columns give HF's tokens."""

import pytest
import torch

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine.cuda_graphs import DecodeGraphs, capture_sizes
from tests.serving.conftest import hf_greedy, make_prompts, written_slots


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(32) == [1, 2, 4, 8, 16, 24, 32]
    assert capture_sizes(36) == [1, 2, 4, 8, 16, 24, 32, 36]


@pytest.mark.parametrize("n", [3, 5])  # padded to 4 and 8 rows
def test_static_buffers_match_hf_and_write_only_real_slots(tiny_llama, n):
    params = SamplingParams(temperature=0.0, max_tokens=20)  # decodes cross block boundaries
    prompts = make_prompts(range(7, 7 + 9 * n, 9), seed=n)
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=48))
    eager = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=48))
    engine.runner.decode_graphs = DecodeGraphs(engine.runner, [1, 2, 4, 8], capture=False)
    engine.runner.decode_graphs.block_tables.fill_(47)  # stale ids past each table must not matter
    outs = engine.generate(prompt_token_ids=prompts, sampling_params=params)
    for p, o in zip(prompts, outs):
        assert o.token_ids == hf_greedy(tiny_llama, p, 20)
    assert engine.runner.decode_graphs.replays == 19  # every decode step took the static path
    eager.generate(prompt_token_ids=prompts, sampling_params=params)
    # spare rows carry slot -1: exactly the eager run's slots hold data
    assert torch.equal(written_slots(engine), written_slots(eager))
