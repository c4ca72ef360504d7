"""`graft bench serve URL`: a seeded load generator for the chat API.

Poisson arrivals at --rate (or a fixed --concurrency), text and image requests (with a
repeat ratio that exercises the encoder cache); reports TTFT/TPOT/ITL percentiles,
throughput, goodput under SLOs and the 429 rate, plus an encoder-cache hit-vs-miss probe.
With --trace, a recorded or synthetic trace's requests at its arrival gaps instead
(serve_trace.py); with --chaos, a soak by misbehaving clients (serve_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass, field

from graft.benchmarks.cli_args import (count, fraction, http_url, non_negative, out_file, positive,
                                      positive_int, server_model)
from graft.benchmarks.prompt_words import random_prompt
from graft.benchmarks.report import emit, percentiles


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("url", type=http_url, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--num-requests", type=positive_int, default=None,
                   help="requests to send (default: 64, or every record of --trace)")
    p.add_argument("--rate", type=non_negative, default=0.0,
                   help="Poisson arrival rate in requests/s (0: use --concurrency)")
    p.add_argument("--concurrency", type=positive_int, default=8,
                   help="closed-loop clients when rate=0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-ratio", type=fraction, default=0.5,
                   help="share of requests with an image (0..1)")
    p.add_argument("--repeat-ratio", type=fraction, default=0.5,
                   help="share of image requests that reuse an image already sent")
    p.add_argument("--image-size", type=positive_int, default=224)
    p.add_argument("--prompt-words", type=positive_int, default=24)
    p.add_argument("--max-tokens", type=positive_int, default=32)
    p.add_argument("--ttft-budget-ms", type=positive, default=None,
                   help="sent with each request (server admission control)")
    p.add_argument("--slo-ttft-ms", type=positive, default=2000.0, help="goodput: TTFT bound")
    p.add_argument("--slo-tpot-ms", type=positive, default=500.0, help="goodput: TPOT bound")
    p.add_argument("--cache-probe", type=count, default=3,
                   help="pairs of (new image, same image again) sent alone first; 0 skips")
    p.add_argument("--trace", default=None, metavar="TRACE",
                   help="send this trace's requests (graft serve --trace, graft tune synth) at "
                        "its arrival gaps, each forced to its recorded output length, instead "
                        "of the generated workload")
    p.add_argument("--speed", type=positive, default=1.0,
                   help="--trace: divide the arrival gaps by this (2: twice the load)")
    p.add_argument("--warmup", type=count, default=0,
                   help="short requests sent at once before the measured load and left out of "
                        "the report: the server's and this client's first-call costs (chat "
                        "template, one connection per client) then fall on no measured request")
    p.add_argument("--timeout-s", type=positive, default=600.0)
    p.add_argument("--out", type=out_file, default=None,
                   help="write the JSON report here (an existing file is replaced)")
    p.add_argument("--chaos", action="store_true",
                   help="soak instead: --concurrency clients mix good, malformed, hung-up, "
                        "given-up, huge-image and half-sent requests for --duration-s, then "
                        "check nothing is held (exit 1 when a check fails)")
    p.add_argument("--duration-s", type=positive, default=60.0, help="--chaos: how long")
    p.add_argument("--half-head-wait-s", type=positive, default=15.0,
                   help="--chaos: a half-sent head not answered (408) by then is a failure")


@dataclass
class Result:
    ok: bool = False
    status: int = 0
    has_image: bool = False
    ttft: float | None = None  # seconds to the first content token
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between content chunks
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    finish_reason: str | None = None
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


class Workload:
    """Seeded request bodies: same seed, same prompts, images and arrival times."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rng = random.Random(args.seed)
        self.sent_images: list[str] = []

    def new_image(self, fresh: bool = False) -> str:
        """A random image; `fresh` ones are unseeded so no earlier run can have cached them."""
        import os

        import numpy as np
        from PIL import Image

        from graft.serving.multimodal.media import to_data_url

        size = self.args.image_size
        seed = int.from_bytes(os.urandom(8), "little") if fresh else self.rng.getrandbits(32)
        pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
        return to_data_url(Image.fromarray(pixels))

    def body(self, model: str, force_image: str | None = None) -> tuple[dict, bool]:
        a = self.args
        words = random_prompt(self.rng, a.prompt_words)
        content: list[dict] = [{"type": "text", "text": words}]
        url = force_image
        if url is None and self.rng.random() < a.image_ratio:
            if self.sent_images and self.rng.random() < a.repeat_ratio:
                url = self.rng.choice(self.sent_images)
            else:
                url = self.new_image()
                self.sent_images.append(url)
        if url is not None:
            content.insert(0, {"type": "image_url", "image_url": {"url": url}})
        body = {"model": model, "messages": [{"role": "user", "content": content}],
                "max_tokens": a.max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True}
        if a.ttft_budget_ms:
            body["ttft_budget_ms"] = a.ttft_budget_ms
        return body, url is not None


async def send(client, url: str, body: dict, has_image: bool) -> Result:
    res = Result(has_image=has_image)
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                res.error = (await resp.aread()).decode(errors="replace")[:300]
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"].get("message")
                    return res
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                    res.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    res.cached_tokens = (chunk["usage"].get("prompt_tokens_details")
                                         or {}).get("cached_tokens", 0)
                for choice in chunk.get("choices", []):
                    now = time.perf_counter()
                    if choice["delta"].get("content"):
                        if res.ttft is None:
                            res.ttft = now - start
                        else:
                            res.itl.append(now - last)
                        last = now
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
        res.e2e = time.perf_counter() - start
        res.ok = res.finish_reason in ("stop", "length")
    except Exception as err:  # network trouble counts as a failed request, not a crash
        res.error = f"{type(err).__name__}: {err}"
    return res


async def cache_probe(client, url: str, model: str, work: Workload, pairs: int) -> dict:
    """TTFT of a never-seen image (encoder cache miss) vs the same request again (hit)."""
    miss, hit = [], []
    for _ in range(pairs):
        body, _ = work.body(model, force_image=work.new_image(fresh=True))
        body["max_tokens"] = 1
        first = await send(client, url, body, True)
        second = await send(client, url, body, True)
        if first.ttft is not None and second.ttft is not None:
            miss.append(first.ttft)
            hit.append(second.ttft)
    # floor: a short, fully prefix-cached text request costs one engine step
    text = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "temperature": 0.0, "stream": True, "ignore_eos": True}
    floor = [r.ttft for r in [await send(client, url, text, False) for _ in range(3)][1:]
             if r.ttft is not None]
    if not miss:
        return {"pairs": 0}
    m, h = sorted(miss)[len(miss) // 2], sorted(hit)[len(hit) // 2]
    return {"pairs": len(miss), "ttft_miss_ms": m * 1000, "ttft_hit_ms": h * 1000,
            "hit_speedup": m / h if h > 0 else None,
            "ttft_floor_ms": min(floor) * 1000 if floor else None}


async def run_load(args: argparse.Namespace) -> dict:
    import asyncio

    import httpx

    url = args.url.rstrip("/")
    records = _trace_records(args) if args.trace else None  # a bad trace fails before any send
    async with httpx.AsyncClient(timeout=args.timeout_s) as client:
        model = await server_model(client, url, args.model)
        if args.warmup > 0:
            body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                    "max_tokens": 2, "temperature": 0.0, "stream": True, "ignore_eos": True}
            await asyncio.gather(*(send(client, url, body, False) for _ in range(args.warmup)))
        work = Workload(args)
        probe = await cache_probe(client, url, model, work, args.cache_probe) \
            if args.cache_probe and args.image_ratio > 0 and not args.trace else None
        if records is not None:
            from graft.benchmarks.serve_trace import trace_workload

            schedule = trace_workload(records, model, args.speed, args.seed)
        else:
            bodies = [work.body(model) for _ in range(args.num_requests or 64)]
            schedule, t = [], 0.0
            for body, has_image in bodies:
                t += work.rng.expovariate(args.rate) if args.rate > 0 else 0.0
                schedule.append((t, body, has_image))
        start = time.perf_counter()
        if args.trace or args.rate > 0:
            tasks = []
            for due, body, has_image in schedule:
                delay = start + due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(send(client, url, body, has_image)))
            results = await asyncio.gather(*tasks)
        else:
            it = ((body, has_image) for _, body, has_image in schedule)
            results = []

            async def worker():
                for body, has_image in it:
                    results.append(await send(client, url, body, has_image))

            await asyncio.gather(*(worker() for _ in range(max(1, args.concurrency))))
        duration = time.perf_counter() - start
    return summarize(args, list(results), duration, probe, model)


def _trace_records(args) -> list:
    from graft.tune.trace import read_trace

    records = sorted(read_trace(args.trace), key=lambda r: r.arrival)
    return records[:args.num_requests] if args.num_requests else records


def summarize(args, results: list[Result], duration: float, probe: dict | None,
              model: str) -> dict:
    ok = [r for r in results if r.ok]
    good = [r for r in ok if r.ttft is not None and r.ttft * 1000 <= args.slo_ttft_ms
            and (r.tpot is None or r.tpot * 1000 <= args.slo_tpot_ms)]
    n = max(len(results), 1)
    out_tokens = sum(r.output_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = str(r.status) if r.status != 200 else (r.finish_reason or "error")
            errors[key] = errors.get(key, 0) + 1
    return {
        "config": {k: v for k, v in vars(args).items() if k not in ("func",)},
        "model": model,
        "duration_s": duration,
        "requests": len(results), "completed": len(ok),
        "ttft_ms": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "ttft_image_ms": percentiles([r.ttft for r in ok if r.ttft is not None and r.has_image]),
        "ttft_text_ms": percentiles([r.ttft for r in ok if r.ttft is not None and not r.has_image]),
        "tpot_ms": percentiles([r.tpot for r in ok if r.tpot is not None]),
        "itl_ms": percentiles([g for r in ok for g in r.itl]),
        "e2e_ms": percentiles([r.e2e for r in ok]),
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_token_throughput": out_tokens / duration if duration else 0.0,
        "goodput": len(good) / duration if duration else 0.0,
        "goodput_share": len(good) / n,
        "rate_429": sum(1 for r in results if r.status == 429) / n,
        "failures": errors,
        "cache_probe": probe,
        "sample_errors": [r.error for r in results if r.error][:3],
    }


def run(args: argparse.Namespace) -> int:
    import asyncio

    if args.chaos:
        from graft.benchmarks import serve_chaos

        return serve_chaos.run(args)
    report = asyncio.run(run_load(args))
    t = report["ttft_ms"]
    print(f"{report['completed']}/{report['requests']} ok in {report['duration_s']:.1f}s  "
          f"req/s {report['request_throughput']:.2f}  "
          f"tok/s {report['output_token_throughput']:.1f}  "
          f"goodput {report['goodput']:.2f} req/s  429 rate {report['rate_429']:.2%}")
    if t["n"]:
        print(f"TTFT ms p50 {t['p50']:.0f}  p90 {t['p90']:.0f}  p99 {t['p99']:.0f}")
    probe = report["cache_probe"]
    if probe and probe.get("pairs"):
        print(f"encoder cache: TTFT miss {probe['ttft_miss_ms']:.0f} ms, hit "
              f"{probe['ttft_hit_ms']:.0f} ms -> {probe['hit_speedup']:.2f}x "
              f"(one-step floor {probe['ttft_floor_ms'] or 0:.0f} ms)")
    emit(report, args.out)
    return 0
