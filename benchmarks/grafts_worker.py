"""One process of `graft bench grafts`: load some grafts into one engine, report the bytes it
holds, wait for "go" on stdin, run its share of the workload and print the measurements.

Protocol (JSON lines): stdin gets the job, stdout answers {"ready": ...}; stdin "go"; stdout
the result. Run as `python -m graft.benchmarks.grafts_worker`.
"""

from __future__ import annotations

import json
import os
import sys
import time


def rss_bytes() -> dict[str, int]:
    """Resident set size now and its peak (VmRSS / VmHWM) of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss" if key == "VmRSS" else "rss_peak"] = int(value.split()[0]) * 1024
    return out


def _tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def resident_bytes(engine) -> dict[str, int]:
    """Parameter and KV bytes this engine holds: the LLM once, each distinct encoder once,
    each projector, and the KV pool."""
    runner, grafts = engine.runner, engine.grafts
    llm = _tensor_bytes(runner.model.resident_tensors())
    enc = sum(_tensor_bytes(list(e.parameters()) + list(e.buffers())) for e in grafts.encoders())
    proj = sum(_tensor_bytes(grafts[n].image_path.projector.parameters()) for n in grafts)
    kv = _tensor_bytes([runner.kv_cache])
    return {"llm_params": llm, "encoder_params": enc, "projector_params": proj, "kv_cache": kv,
            "total": llm + enc + proj + kv}


def _image(seed: int, size: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def run_workload(engine, requests: list[dict], image_size: int, max_tokens: int) -> dict:
    """Requests arrive at their `at` offsets (seconds from start); each is prepared (and its
    image encoded) when it arrives. Returns timings per request."""
    from graft.serving import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    todo = sorted(requests, key=lambda r: r["at"])
    arrival, first, n_out = {}, {}, {}
    bm = engine.block_manager
    hit0, query0 = bm.hit_tokens, bm.query_tokens  # prefix-cache counters are cumulative
    start = time.perf_counter()
    while todo or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while todo and todo[0]["at"] <= now:
            r = todo.pop(0)
            front = engine.grafts[r["graft"]]
            images = [_image(r["image_seed"], image_size)] if r["image_seed"] is not None else []
            marker = "<image>\n" if images else ""
            arrival[r["id"]] = start + r["at"]
            ids, mm = front.prepare_chat([{"role": "user", "content": marker + r["prompt"]}],
                                         images, owner=r["id"])
            engine.add_request(r["id"], prompt_token_ids=ids, mm_inputs=mm, sampling_params=params)
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(0.01, todo[0]["at"] - now)) if todo else 0.0)
            continue
        for out in engine.step():
            t = time.perf_counter()
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = t
            if out.finished:
                n_out[out.request_id] = len(out.token_ids)
                engine.grafts.cache.release(out.request_id)
                if out.finish_reason == "error":
                    raise RuntimeError(f"request {out.request_id} failed: {out.error}")
    wall = time.perf_counter() - start
    ttft = {rid: first[rid] - arrival[rid] for rid in first}
    queried = bm.query_tokens - query0
    return {"wall_s": wall, "output_tokens": sum(n_out.values()), "requests": len(n_out),
            "ttft_s": ttft,
            "prefix_cache_hit_rate": (bm.hit_tokens - hit0) / queried if queried else 0.0,
            "encoder_cache": engine.grafts.cache.stats()}


def main() -> int:
    import torch

    from graft.serving import Engine, EngineConfig

    job = json.loads(sys.stdin.readline())
    os.sched_setaffinity(0, job["cpus"])  # both setups share the same cores
    torch.set_num_threads(job["threads"])
    engine = Engine.from_grafts(job["grafts"], EngineConfig(**job["engine"]), llm=job["llm"])
    # warm-up outside the measurement: one text and one image request per graft
    warm = [{"id": f"warm-{n}-{k}", "graft": n, "at": 0.0, "prompt": "Warm up.",
             "image_seed": 10_000 + k if k else None} for n in job["grafts"] for k in (0, 1)]
    run_workload(engine, warm, job["image_size"], 2)
    engine.grafts.cache.clear()
    ready = {"ready": True, "bytes": resident_bytes(engine), **rss_bytes()}
    print(json.dumps(ready), flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    result = run_workload(engine, job["requests"], job["image_size"], job["max_tokens"])
    result.update(rss_after=rss_bytes())
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
