"""Runs inside .venv-vllm (never imported by the tests): vLLM `LLM.generate` over exported grafts.

    python vllm_driver.py JOBS.json OUT.json

JOBS.json: [{"model": export dir, "prompts": [{"prompt": text, "images": [png paths]}],
"max_tokens": n}]; OUT.json: per job, per prompt {"prompt_token_ids", "token_ids"}. Every job
runs in this one process, one `LLM` after another (vLLM's start-up costs once, not per model).
"""

from __future__ import annotations

import gc
import json
import sys
import time


def run_job(job: dict) -> list[dict]:
    from PIL import Image
    from vllm import LLM, SamplingParams

    most_images = max(len(p["images"]) for p in job["prompts"])
    llm = LLM(model=job["model"], dtype="float32", enforce_eager=True, max_model_len=512,
              max_num_seqs=8, seed=0, limit_mm_per_prompt={"image": max(most_images, 1)})
    requests = []
    for p in job["prompts"]:
        request = {"prompt": p["prompt"]}
        if p["images"]:
            request["multi_modal_data"] = {"image": [Image.open(f).convert("RGB") for f in p["images"]]}
        requests.append(request)
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"], ignore_eos=True)
    outs = llm.generate(requests, params, use_tqdm=False)
    del llm
    gc.collect()
    return [{"prompt_token_ids": list(o.prompt_token_ids), "token_ids": list(o.outputs[0].token_ids)}
            for o in outs]


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    results = []
    for job in jobs:
        start = time.monotonic()
        results.append({"model": job["model"], "outputs": run_job(job),
                        "seconds": time.monotonic() - start})
    with open(sys.argv[2], "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main()
