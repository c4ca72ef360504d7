"""`python -m graft.benchmarks.trace_cost`: the CPU cost of one `graft serve --trace` line, on
the engine thread (the enqueue) and on the writer thread (build the line, hash the images,
JSON, write), for a text request of `graft bench serve`'s shape and one with a 224x224 image.
CPU time of the calling thread (time.thread_time), so other jobs on the machine barely move it.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path


def _job(with_image: bool):
    import numpy as np
    from PIL import Image

    from graft.serving.engine.sampling_params import SamplingParams
    from graft.serving.http.openai import openai_chat as P
    from graft.serving.http.job import Job
    from graft.serving.multimodal.front import PreparedImage, PreparedPrompt

    body = {"model": "m", "messages": [{"role": "user", "content": " ".join(["word"] * 24)}],
            "max_tokens": 32, "temperature": 0, "stream": True}
    prepared = None
    if with_image:
        pixels = np.random.default_rng(0).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        image = PreparedImage("key", Image.fromarray(pixels), 49, 49 * 576 * 4)
        prepared = PreparedPrompt(list(range(100)), [image], [(5, 49)])
    now = time.monotonic()
    return Job("bench", list(range(54)), SamplingParams(temperature=0, max_tokens=32),
               sink=None, request=P.parse_chat_request(json.dumps(body).encode()),
               prepared=prepared, arrival=now - 2, first_token_at=now - 1, n_output=32)


def measure(with_image: bool, n: int) -> dict:
    from graft.serving.engine.outputs import RequestOutput
    from graft.serving.http.plumbing.trace_log import TraceWriter

    job = _job(with_image)
    out = RequestOutput("bench", [], list(range(32)), "", finished=True, finish_reason="length")
    with tempfile.TemporaryDirectory() as tmp:
        writer = TraceWriter(Path(tmp) / "trace.jsonl")
        start = time.thread_time()
        for _ in range(n):
            writer.record(job, out, "ok", time.monotonic())
        enqueue = (time.thread_time() - start) / n
        start = time.thread_time()
        for _ in range(n):
            writer._write(json.dumps(writer.line(job, out, "ok", time.monotonic(), 0.0)) + "\n")
        line = (time.thread_time() - start) / n
        writer.close()
    return {"image": with_image, "enqueue_us": enqueue * 1e6, "line_us": line * 1e6}


def main() -> None:
    for with_image, n in ((False, 2000), (True, 300)):
        r = measure(with_image, n)
        print(f"{'image 224x224' if with_image else 'text'}: engine thread {r['enqueue_us']:.1f} "
              f"us/request, writer thread {r['line_us']:.0f} us/request (CPU time)")


if __name__ == "__main__":
    main()
