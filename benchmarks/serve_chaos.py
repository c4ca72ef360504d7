"""`graft bench serve URL --chaos`: a soak of a running server by clients that misbehave.

--concurrency clients loop for --duration-s, each request drawn (seeded) from a mix: good
streaming and non-streaming chats (text, and images when the model takes them), malformed
bodies, streams hung up mid-answer, non-streaming requests given up early, images whose
header claims 60000x60000 pixels, and heads sent half-way and left (slowloris). Then, once
the server is idle, its /metrics must show no KV block and no encoder-cache byte still held,
/health must answer, and no request may have got a 5xx or an answer of the wrong kind.
Prints a summary and writes JSON: requests/s, latency p50/p99, counts by status and by kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass

from graft.benchmarks.cli_args import server_model
from graft.benchmarks.report import emit, percentiles

CHAT = "/v1/chat/completions"
# kind -> weight in the mix
MIX = {"stream": 4, "complete": 3, "malformed": 3, "hang_up": 2, "give_up": 1,
       "huge_image": 1, "half_head": 0.25}
_MALFORMED_KINDS = 12
IDLE_WAIT_S = 60.0  # after the clients stop: time the server gets to finish what they left


@dataclass
class Outcome:
    kind: str
    status: int  # HTTP status; 0: the client ended it (a hang-up) or the network failed
    seconds: float
    expected: bool  # the answer was what this kind must get
    ttft: float | None = None
    note: str = ""


def png_claiming(width: int, height: int) -> bytes:
    """A real 1x1 PNG whose header claims width x height (CRC fixed up)."""
    import io
    import struct
    import zlib

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    ihdr = 8 + 4  # signature, chunk length; then b"IHDR" + 13 bytes of header
    data[ihdr + 4:ihdr + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[ihdr:ihdr + 4 + 13]))
    data[ihdr + 17:ihdr + 21] = struct.pack(">I", crc)
    return bytes(data)


def _data_url(png: bytes) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(png).decode()


def _image_url(rng: random.Random, size: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    color = tuple(rng.randrange(256) for _ in range(3))
    Image.new("RGB", (size, size), color).save(buf, format="PNG")
    return _data_url(buf.getvalue())


def malformed(model: str, i: int) -> bytes:
    """The i-th (mod _MALFORMED_KINDS) body the server must refuse with a 4xx."""
    hi = [{"role": "user", "content": "hi"}]
    bodies = [
        b"{not json",
        b"[" * 5000 + b"]" * 5000,  # deeper than any parser should recurse
        b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}'
        % model.encode(),  # a lone surrogate
        json.dumps([1, 2]).encode(),
        json.dumps({"model": model, "messages": []}).encode(),
        json.dumps({"model": model, "messages": hi, "max_tokens": "10"}).encode(),
        json.dumps({"model": model, "messages": hi, "seed": 2 ** 64}).encode(),
        json.dumps({"model": model, "messages": hi, "temperature": True}).encode(),
        json.dumps({"model": "no-such-model", "messages": hi}).encode(),
        json.dumps({"model": model, "messages": [{"role": "tool", "content": "x"}]}).encode(),
        json.dumps({"model": model, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}]}]}).encode(),
        json.dumps({"model": model, "messages": hi, "max_tokens": 10 ** 9}).encode(),
    ]
    return bodies[i % len(bodies)]


class Chaos:
    def __init__(self, args: argparse.Namespace, model: str, images: bool):
        self.args, self.model, self.images = args, model, images
        self.url = args.url.rstrip("/")
        self.huge = _data_url(png_claiming(60_000, 60_000))
        self.outcomes: list[Outcome] = []

    def chat(self, rng: random.Random, stream: bool) -> dict:
        words = " ".join(rng.choice(("red", "blue", "what", "is", "this", "shape", "count"))
                         for _ in range(rng.randint(2, 24)))
        content: list | str = words
        if self.images and rng.random() < 0.5:
            # a few distinct pictures: repeats hit the encoder cache, new ones miss it
            content = [{"type": "image_url", "image_url": {"url": _image_url(
                random.Random(rng.randrange(8)), self.args.image_size)}},
                       {"type": "text", "text": words}]
        return {"model": self.model, "messages": [{"role": "user", "content": content}],
                "max_tokens": rng.randint(1, self.args.max_tokens), "stream": stream,
                "temperature": rng.choice([0, 0.7]), "ignore_eos": rng.random() < 0.5}

    async def one(self, client, rng: random.Random, kind: str) -> Outcome:
        import httpx

        start = time.perf_counter()

        def done(status: int, expected: bool, ttft=None, note="") -> Outcome:
            return Outcome(kind, status, time.perf_counter() - start, expected, ttft, note)

        try:
            if kind in ("stream", "hang_up"):
                stop_after = rng.randint(1, 6) if kind == "hang_up" else None
                return await self._stream(client, self.chat(rng, True), stop_after, done)
            if kind == "complete":
                resp = await client.post(self.url + CHAT, json=self.chat(rng, False))
                ok = resp.status_code == 200 and "choices" in resp.json()
                return done(resp.status_code, ok or resp.status_code == 429, note=_note(resp))
            if kind == "give_up":
                try:
                    resp = await client.post(self.url + CHAT, json=self.chat(rng, False),
                                             timeout=rng.uniform(0.02, 0.5))
                    return done(resp.status_code, resp.status_code in (200, 429))
                except httpx.TimeoutException:  # the point: the client walked away
                    return done(0, True, note="gave up")
            if kind == "malformed":
                resp = await client.post(self.url + CHAT, content=malformed(
                    self.model, rng.randrange(_MALFORMED_KINDS)),
                    headers={"content-type": "application/json"})
                return done(resp.status_code, 400 <= resp.status_code < 500
                            and _is_error_body(resp), note=_note(resp))
            if kind == "huge_image":
                body = {"model": self.model, "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": self.huge}}]}]}
                resp = await client.post(self.url + CHAT, json=body)
                want = 413 if self.images else 400  # a text-only model refuses any image
                return done(resp.status_code, resp.status_code == want and _is_error_body(resp),
                            note=_note(resp))
            return await self._half_head(done)
        except Exception as err:  # noqa: BLE001 - a broken connection is a finding, not a crash
            return done(0, False, note=f"{type(err).__name__}: {err}"[:200])

    async def _stream(self, client, body: dict, stop_after: int | None, done) -> Outcome:
        start, ttft, events = time.perf_counter(), None, 0
        async with client.stream("POST", self.url + CHAT, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return done(resp.status_code, resp.status_code == 429, note=_note(resp))
            finished = False
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events += 1
                if stop_after is not None and events >= stop_after:
                    return done(0, True, note="hung up")
                if line == "data: [DONE]":
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return done(200, False, note=f"error event: {chunk['error']}"[:200])
                for choice in chunk.get("choices", []):
                    if ttft is None and choice["delta"].get("content"):
                        ttft = time.perf_counter() - start
                    finished = finished or bool(choice.get("finish_reason"))
            return done(200, finished, ttft, "" if finished else "no finish_reason")

    async def _half_head(self, done) -> Outcome:
        """Half a request head, then silence: the server must answer 408 and close."""
        from urllib.parse import urlparse

        where = urlparse(self.url)
        reader, writer = await asyncio.open_connection(where.hostname, where.port or 80)
        try:
            writer.write(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            reply = await asyncio.wait_for(reader.read(65536), self.args.half_head_wait_s)
        except asyncio.TimeoutError:
            return done(0, False, note=f"held over {self.args.half_head_wait_s:g} s")
        finally:
            writer.close()
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0
        return done(status, status == 408, note=reply[:80].decode(errors="replace"))

    async def client(self, http, seed: int, until: float) -> None:
        rng = random.Random(seed)
        kinds, weights = list(MIX), list(MIX.values())
        while time.perf_counter() < until:
            kind = rng.choices(kinds, weights)[0]
            if kind == "huge_image" and not self.images:
                kind = "malformed"
            self.outcomes.append(await self.one(http, rng, kind))


def _is_error_body(resp) -> bool:
    try:
        err = resp.json()["error"]
    except Exception:  # noqa: BLE001 - not JSON, or not the error shape
        return False
    return isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}


def _note(resp) -> str:
    return "" if resp.status_code == 200 else resp.text[:200]


async def server_state(http, url: str) -> dict[str, float]:
    """/metrics as {series name: value} (unlabelled series only)."""
    text = (await http.get(url + "/metrics")).text
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if line and not line.startswith("#") and "{" not in name:
            out[name] = float(value)
    return out


async def wait_idle(http, url: str, timeout_s: float) -> dict[str, float]:
    """The server's metrics once nothing runs or waits (or when `timeout_s` is up)."""
    end = time.monotonic() + timeout_s
    while True:
        state = await server_state(http, url)
        idle = state.get("graft_running_requests", 0) == 0 \
            and state.get("graft_queue_depth", 0) == 0
        if idle or time.monotonic() > end:
            return state
        await asyncio.sleep(0.1)


async def run_chaos(args: argparse.Namespace) -> dict:
    import httpx

    url = args.url.rstrip("/")
    limits = httpx.Limits(max_connections=args.concurrency * 2)
    async with httpx.AsyncClient(timeout=args.timeout_s, limits=limits) as http:
        model = await server_model(http, url, args.model)
        probe = await http.post(url + CHAT, json={"model": model, "max_tokens": 1, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": _image_url(random.Random(0), 32)}}, {"type": "text", "text": "hi"}]}]})
        images = probe.status_code == 200
        chaos = Chaos(args, model, images)
        before = await wait_idle(http, url, 30)
        start = time.perf_counter()
        until = start + args.duration_s
        await asyncio.gather(*(chaos.client(http, args.seed * 1000 + i, until)
                               for i in range(args.concurrency)))
        duration = time.perf_counter() - start
        after = await wait_idle(http, url, IDLE_WAIT_S)
        health = (await http.get(url + "/health")).status_code
    return summarize(chaos.outcomes, duration, before, after, health, model, images, args)


def summarize(outcomes: list[Outcome], duration: float, before: dict, after: dict,
              health: int, model: str, images: bool, args) -> dict:
    by_status: dict[str, int] = {}
    by_kind: dict[str, dict] = {}
    for o in outcomes:
        by_status[str(o.status)] = by_status.get(str(o.status), 0) + 1
        k = by_kind.setdefault(o.kind, {"n": 0, "statuses": {}, "unexpected": 0, "_s": []})
        k["n"] += 1
        k["statuses"][str(o.status)] = k["statuses"].get(str(o.status), 0) + 1
        k["unexpected"] += not o.expected
        k["_s"].append(o.seconds)
    for k in by_kind.values():
        k["latency_ms"] = percentiles(k.pop("_s"))
    good = [o for o in outcomes if o.kind in ("stream", "complete") and o.status == 200]
    unexpected = [o for o in outcomes if not o.expected]
    server_errors = sum(1 for o in outcomes if o.status >= 500)
    leaks = {"kv_blocks_used": after.get("graft_kv_blocks_used"),
             "encoder_cache_pinned_bytes": after.get("graft_encoder_cache_pinned_bytes"),
             "running_requests": after.get("graft_running_requests"),
             "queue_depth": after.get("graft_queue_depth")}
    checks = {"no_5xx": server_errors == 0, "all_answers_expected": not unexpected,
              "nothing_held_after": all(v == 0 for v in leaks.values()),
              "healthy_after": health == 200}
    aborted = after.get("graft_requests_aborted_total", 0) \
        - before.get("graft_requests_aborted_total", 0)
    return {
        "config": {k: v for k, v in vars(args).items() if k != "func"},
        "model": model, "images": images, "duration_s": duration,
        "requests": len(outcomes), "requests_per_s": len(outcomes) / duration if duration else 0,
        "good_completed": len(good),
        "latency_ms": percentiles([o.seconds for o in outcomes]),
        "good_latency_ms": percentiles([o.seconds for o in good]),
        "ttft_ms": percentiles([o.ttft for o in good if o.ttft is not None]),
        "by_status": dict(sorted(by_status.items())), "by_kind": by_kind,
        "server_aborted": aborted, "after": leaks, "checks": checks,
        "passed": all(checks.values()),
        "unexpected": [vars(o) for o in unexpected[:10]],
    }


def run(args: argparse.Namespace) -> int:
    report = asyncio.run(run_chaos(args))
    failed = [name for name, ok in report["checks"].items() if not ok]
    lat = report["latency_ms"]
    print(f"chaos: {report['requests']} requests in {report['duration_s']:.1f}s "
          f"({report['requests_per_s']:.1f}/s) by {args.concurrency} clients; latency "
          f"p50 {lat['p50'] or 0:.0f} ms p99 {lat['p99'] or 0:.0f} ms; status "
          f"{report['by_status']}; after: {report['after']}")
    print("chaos: passed" if not failed else f"chaos: FAILED {', '.join(failed)}; first "
          f"unexpected: {report['unexpected'][:3]}")
    emit(report, args.out)
    return 0 if not failed else 1
