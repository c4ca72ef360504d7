"""Runs inside .venv-vllm (never imported by graft): vLLM's offline engine timed as
`graft bench engine --quantization` times graft's.

    python peers_vllm_driver.py JOB.json OUT.json

JOB.json: {"model", "dtype", "max_model_len", "vocab", "context", "decode_tokens", "batch",
"batch_prompt", "prompt_len", "seed"}. OUT.json: tok/s of batch-1 decode, decode of `batch`
sequences and prefill of `prompt_len` tokens (the median of 3 after a warm-up). Times come from vLLM's own per-request stamps
(first and last token), so start-up and prefill stay out of the decode figures.
"""

from __future__ import annotations

import json
import random
import sys

PREFILL_PASSES = 3  # as graft.benchmarks.formats (this file runs in .venv-vllm: no import)


def main() -> None:
    from vllm import LLM, SamplingParams

    job = json.loads(open(sys.argv[1]).read())
    rng = random.Random(job["seed"])

    def prompts(n: int, length: int) -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(3, job["vocab"]) for _ in range(length)]}
                for _ in range(n)]

    # no prefix cache: each measured prompt is new anyway, and a warm-up must not make it free
    llm = LLM(model=job["model"], dtype=job["dtype"], max_model_len=job["max_model_len"],
              max_num_seqs=max(job["batch"], 1), # one step prefills the whole batch: every sequence then decodes from the same step on
              max_num_batched_tokens=max(job["prompt_len"], job["batch"] * job["batch_prompt"], 2048),
              enable_prefix_caching=False, disable_log_stats=False, seed=0)

    def run(batch: list[dict], max_tokens: int):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return [o.metrics for o in llm.generate(batch, params, use_tqdm=False)]

    run(prompts(2, 32), 8)  # warm-up: first-call allocations and compiles
    one = run(prompts(1, job["context"]), job["decode_tokens"])[0]
    new = max(job["decode_tokens"] // 2, 2)
    many = run(prompts(job["batch"], job["batch_prompt"]), new)
    # prefill as graft's bench times it: a warm-up prompt of this length (the shape's first
    # call), then the median of PREFILL_PASSES fresh prompts
    run(prompts(1, job["prompt_len"]), 1)
    prefill_s = sorted(m.first_token_ts - m.scheduled_ts
                       for m in (run(prompts(1, job["prompt_len"]), 1)[0] for _ in range(PREFILL_PASSES)))
    # decode of the batch: from the last first token (all sequences decoding) to the last token
    batch_s = max(m.last_token_ts for m in many) - max(m.first_token_ts for m in many)
    out = {"batch1_decode": (job["decode_tokens"] - 1) / (one.last_token_ts - one.first_token_ts),
           "batch_decode": job["batch"] * (new - 1) / batch_s,
           "prefill": job["prompt_len"] / prefill_s[len(prefill_s) // 2]}
    with open(sys.argv[2], "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
