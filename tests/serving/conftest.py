"""Shared helpers for engine tests: seeded prompts and cached HF greedy references."""

import pytest
import torch

_HF_MODELS: dict = {}
_HF_CACHE: dict = {}


def make_prompts(lengths, seed=0, vocab=384):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def hf_greedy(model_dir, prompt, max_new_tokens, device="cpu"):
    """HF transformers `generate` greedy continuation (eos from generation_config), fp32 on
    `device`, cached."""
    from transformers import AutoModelForCausalLM

    key = (str(model_dir), tuple(prompt), max_new_tokens, device)
    if key not in _HF_CACHE:
        if (str(model_dir), device) not in _HF_MODELS:
            _HF_MODELS[str(model_dir), device] = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32).to(device).eval()
        model = _HF_MODELS[str(model_dir), device]
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=max_new_tokens, do_sample=False)
        _HF_CACHE[key] = out[0, len(prompt):].tolist()
    return _HF_CACHE[key]


def three_decodes(engine, params):
    """Prompts of 5, 17 and 40 tokens run through their prefill step; returns the
    next scheduled batch: the three sequences decoding one token each."""
    for i, p in enumerate(make_prompts((5, 17, 40), seed=7)):
        engine.add_request(str(i), prompt_token_ids=p, sampling_params=params)
    engine.step()
    batch, _ = engine.scheduler.schedule()
    assert batch.num_decodes == len(batch.seqs) == 3
    return batch


def fused_then_per_op(engine, batch):
    """Execute the all-decode `batch` on the engine's one-call C decode path, then again op by
    op from the same KV cache: (fused logits, per-op logits, KV pools after the fused run,
    pools as they were before it). The pools are left as the per-op run wrote them."""
    runner, model = engine.runner, engine.runner.model
    pools = [runner.kv_cache] + ([runner.kv_scales] if runner.kv_scales is not None else [])
    before = [t.clone() for t in pools]
    fused_logits = runner.execute(batch)[0]
    fused = [t.clone() for t in pools]
    for t, b in zip(pools, before):
        t.copy_(b)
    keep, model.fused_decode = model.fused_decode, None
    try:
        per_op_logits = runner.execute(batch)[0]
    finally:
        model.fused_decode = keep
    assert all(torch.equal(f, t) for f, t in zip(fused, pools)), "the KV caches differ"
    return fused_logits, per_op_logits, fused, before


def written_slots(engine) -> torch.Tensor:
    """[layer, k/v, block, slot] bool: which KV cache slots hold anything."""
    return (engine.runner.kv_cache != 0).flatten(4).any(-1)


@pytest.fixture(scope="session")
def hf_ref():
    return hf_greedy


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny shapes on a shared 2-core box: one thread avoids OpenMP spin contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def drain(engine, add=lambda: None, after_step=lambda: None) -> dict:
    """Step `engine` until nothing is left: `add()` before each step (new arrivals),
    `after_step()` after it; {request id: final output}."""
    done = {}
    while True:
        add()
        if not engine.has_unfinished_requests():
            return done
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        after_step()


def mixed_arrivals(engine, submit, n: int, rng) -> tuple[dict, set]:
    """Requests r0..r{n-1} (`submit(i)` adds request i as `f"r{i}"`), about half arriving
    between steps and about one step in 20 aborting a running one, all drained:
    ({request id: final output}, aborted ids)."""
    waiting, aborted = list(range(n)), set()

    def add():
        while waiting and (rng.random() < 0.5 or not engine.has_unfinished_requests()):
            submit(waiting.pop(0))

    def maybe_abort():
        if engine.seqs and rng.random() < 0.05:
            victim = rng.choice(sorted(engine.seqs))
            assert engine.abort(victim)
            aborted.add(victim)

    return drain(engine, add, maybe_abort), aborted
