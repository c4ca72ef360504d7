"""Under sampling, speculative decoding keeps the output distribution: the empirical joint
distribution of the first three tokens over many seeds fits the exact one (chi-square). The
first decode step proposes the likeliest second token (accepted sometimes) and then a token
outside the top-k (never accepted)."""

import pytest
import torch

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.engine.sampler import Sampler
from graft.serving.engine.sequence import Sequence
from tests.serving.conftest import make_prompts

N = 1500
PARAMS = dict(temperature=0.8, top_k=3, max_tokens=3)


class FixedProposer:
    """After the first sampled token t1: [likeliest t2 given t1, a token of probability 0]."""

    def __init__(self, prompt_len, mode2, outside):
        self.prompt_len, self.mode2, self.outside = prompt_len, mode2, outside

    def propose(self, token_ids, limit=None):
        if len(token_ids) != self.prompt_len + 1:
            return []
        return [self.mode2[token_ids[-1]], self.outside][:limit]


def _exact_joint(model_dir, prompt):
    """{(t1, t2, t3): probability} of the first three sampled tokens, from HF logits."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = Sequence("x", prompt, SamplingParams(**PARAMS), 0)

    def dist(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1:].float()
        return Sampler.probs(logits, [seq])[0]

    joint = {(): 1.0}
    for _ in range(3):
        joint = {k + (t,): q * float(p[t]) for k, q in joint.items()
                 for p in [dist(prompt + list(k))] for t in torch.nonzero(p).flatten().tolist()}
    return joint


@pytest.mark.parametrize("speculative", ["off", "ngram"])
def test_first_tokens_follow_the_model_distribution(tiny_llama, speculative):
    from scipy.stats import chisquare

    prompt = make_prompts([11], seed=9)[0]
    joint = _exact_joint(tiny_llama, prompt)
    pairs = {}
    for (t1, t2, _), q in joint.items():
        pairs[t1, t2] = pairs.get((t1, t2), 0.0) + q
    mode2 = {t1: max((k for k in pairs if k[0] == t1), key=pairs.get)[1] for t1, _ in pairs}
    outside = next(t for t in range(3, 384) if all(k[2] != t for k in joint))  # p = 0
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=256, max_num_seqs=64,
                                                             speculative=speculative))
    engine.spec.ngram = FixedProposer(len(prompt), mode2, outside)
    params = [SamplingParams(seed=s, **PARAMS) for s in range(N)]
    outs = engine.generate(prompt_token_ids=[prompt] * N, sampling_params=params)
    stats = engine.stats()
    if speculative == "ngram":
        assert stats.spec_verify_steps == N and 0 < stats.spec_accepted_tokens < N
    counts = {}
    for o in outs:
        key = tuple(o.token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(joint)
    keys = sorted(joint)
    expected = torch.tensor([joint[k] for k in keys], dtype=torch.float64) * N
    observed = torch.tensor([counts.get(k, 0) for k in keys], dtype=torch.float64)
    # pool rare outcomes so every expected count is >= 5 (the chi-square approximation)
    rare = expected < 5
    if rare.any():
        expected = torch.cat([expected[~rare], expected[rare].sum()[None]])
        observed = torch.cat([observed[~rare], observed[rare].sum()[None]])
    expected *= observed.sum() / expected.sum()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3
