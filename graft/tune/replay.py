"""Replay a trace against an in-process engine through the server's own request path: each
record becomes the chat body a client would send, `to_engine_request` validates it, and the
server's EngineWorker admits, encodes and steps it, exactly as under `graft serve`.

One thread drives it: it submits the records whose arrival time has come, runs one worker
step, and sleeps until the next arrival when idle. Time comes from a clock: WallClock (real
time, the CLI) or StepClock (every engine step costs a fixed time: deterministic, for tests).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

from graft.errors import GraftConfigError, GraftError
from graft.tune.trace import TraceRecord

MODEL_NAME = "replay"  # the served name the replayed bodies ask for
_STALL_ROUNDS = 10_000  # idle worker rounds with queued work before a replay gives up


class WallClock:
    def now(self) -> float:
        return time.perf_counter()

    def wait_until(self, t: float) -> None:
        while (delay := t - self.now()) > 0:
            time.sleep(min(delay, 60.0))  # time.sleep overflows past ~9e9 s

    def tick(self) -> None:
        pass  # real time passes by itself


class StepClock:
    """Deterministic time: an engine step costs `step_s` seconds, waiting costs nothing."""

    def __init__(self, step_s: float = 0.01):
        self.t, self.step_s = 0.0, step_s

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def tick(self) -> None:
        self.t += self.step_s


@dataclass
class _Outcome:
    arrival: float  # when it was due (clock time): TTFT counts queueing before submission too
    first: float | None = None
    end: float | None = None
    n_out: int = 0
    status: str = "ok"


def split_options(options: dict) -> tuple[dict, int]:
    """(EngineConfig options, encoder cache bytes) of a candidate's flat serve options."""
    from graft.serving.multimodal.front import DEFAULT_CACHE_BYTES

    engine = {k: v for k, v in options.items() if k != "encoder_cache_mb"}
    mb = options.get("encoder_cache_mb")
    return engine, DEFAULT_CACHE_BYTES if mb is None else int(mb * 1024 * 1024)


def load_engine(model, options: dict):
    """An engine for `model` (run dir or LLM dir) with a candidate's serve options."""
    from graft.serving import Engine, EngineConfig

    engine_options, cache_bytes = split_options(options)
    return Engine.from_pretrained(model, EngineConfig.for_serving(**engine_options), cache_bytes)


_RECHECK: list = []  # the process's graft.threads.ThreadRecheck, made on the first replay


def _recheck_threads() -> None:
    """A tune runs for minutes: other work that ended since the last replay frees its cores
    for the next (graft.threads)."""
    if not _RECHECK:
        from graft.threads import ThreadRecheck

        _RECHECK.append(ThreadRecheck())
    _RECHECK[0].tick()


def replay(engine, records: list[TraceRecord], speed: float = 1.0, clock=None,
           warmup: bool = True, seed: int = 0) -> dict:
    """Replay `records` (arrival gaps divided by `speed`) on `engine`; returns the summary:
    TTFT/TPOT/e2e percentiles (ms), output tokens/s, requests/s, engine steps, failures."""
    from graft.serving.http.context import ServerContext, ServerSettings
    from graft.serving.http.job import Job

    clock = clock or WallClock()
    _recheck_threads()  # between replays, never inside one: a replay's speed is one setting's
    settings = ServerSettings(model_name=MODEL_NAME, limit_images_per_prompt=max(
        [1] + [len(r.images) for r in records]))
    ctx = ServerContext(engine, settings)
    front = ctx.models[MODEL_NAME]
    rng = random.Random(seed)
    requests = [_engine_request(ctx, front, r, i, rng) for i, r in enumerate(records)]
    if warmup:
        ctx.worker.warmup()
    base = records[0].arrival
    due = [(r.arrival - base) / speed for r in records]
    outcomes: list[_Outcome] = []
    steps, busy = [0], 0.0  # engine steps; clock time in worker rounds that stepped
    step = engine.step

    def timed_step():  # the clock charges every engine step the worker runs
        outs = step()
        steps[0] += 1
        clock.tick()
        return outs

    engine.step = timed_step
    observe = engine.cost.observe_step
    if isinstance(clock, StepClock):  # the engine's cost model gets the clock's step time too:
        # the speculation controller weighs verify steps by it (else the result would
        # depend on this machine's speed after all)
        engine.cost.observe_step = lambda prefill, decodes, _seconds, verify_rows=0: observe(
            prefill, decodes, clock.step_s, verify_rows)
    try:
        start, i, idle = clock.now(), 0, 0
        while i < len(records) or ctx.worker.pending or engine.has_unfinished_requests():
            while i < len(records) and clock.now() - start >= due[i]:
                outcome = _Outcome(start + due[i])
                outcomes.append(outcome)
                er = requests[i]
                ctx.worker.submit(Job(
                    f"replay-{i}", er.ids, er.params, sink=_sink(clock, outcome),
                    prepared=er.prepared, front=front, graft=MODEL_NAME,
                    encode_tokens=front.uncached_tokens(er.prepared.images)
                    if er.prepared else 0), None)
                i += 1
            if ctx.worker.pending or engine.has_unfinished_requests():
                before, t0 = steps[0], clock.now()
                ctx.worker._run_once([])  # the server's step: admissions, encodes, one step
                if steps[0] > before:  # (a round that only waited for cache room is idle)
                    busy += clock.now() - t0
                idle = 0 if steps[0] > before else idle + 1
                if idle > _STALL_ROUNDS:
                    raise GraftError("replay stalled: queued requests never entered the engine "
                                     "(encoder cache too small for them?)")
            elif i < len(records):
                clock.wait_until(start + due[i])
    finally:
        engine.step, engine.cost.observe_step = step, observe
    return summarize(outcomes, clock.now() - start, steps[0], busy)


def _sink(clock, outcome: _Outcome):
    def sink(kind: str, payload) -> None:
        now = clock.now()
        if kind != "output":  # error or deadline: ended without an answer
            outcome.end, outcome.status = now, kind
            return
        if outcome.first is None and payload.token_ids:
            outcome.first = now
        if payload.finished:
            outcome.end, outcome.n_out = now, len(payload.token_ids)
            if payload.finish_reason not in ("stop", "length"):
                outcome.status = payload.finish_reason or "error"

    return sink


def summarize(outcomes: list[_Outcome], duration: float, steps: int, busy: float = 0.0) -> dict:
    """The replay's numbers. Output tokens per second of replay is the offered load whenever
    the engine keeps up; per second the engine was busy stepping, it is what the configuration
    could sustain (its capacity), and that is what tells configurations apart."""
    from graft.benchmarks.report import percentiles

    ok = [o for o in outcomes if o.status == "ok" and o.end is not None]
    ttft = [o.first - o.arrival for o in ok if o.first is not None]
    tpot = [(o.end - o.first) / (o.n_out - 1) for o in ok if o.first is not None and o.n_out > 1]
    out_tokens = sum(o.n_out for o in ok)
    return {"requests": len(outcomes), "completed": len(ok),
            "failed": len(outcomes) - len(ok), "duration_s": duration, "steps": steps,
            "ttft_ms": percentiles(ttft), "tpot_ms": percentiles(tpot),
            "e2e_ms": percentiles([o.end - o.arrival for o in ok]),
            "output_tokens": out_tokens,
            "output_tokens_per_s": out_tokens / duration if duration > 0 else 0.0,
            "busy_s": busy, "capacity_tokens_per_s": out_tokens / busy if busy > 0 else 0.0,
            "requests_per_s": len(ok) / duration if duration > 0 else 0.0}


def _engine_request(ctx, front, record: TraceRecord, index: int, rng: random.Random):
    """The server's EngineRequest for one record: its messages (or synthesized ones of the
    recorded shape), forced to the recorded output length (ignore_eos) so every candidate
    generates the same number of tokens."""
    from graft.serving.http.openai import openai_chat as P

    messages = record.messages or _shaped_messages(ctx, record, rng)
    body = {"model": MODEL_NAME, "messages": messages, "temperature": record.temperature,
            "max_tokens": max(1, record.output_tokens), "ignore_eos": True,
            "stream": record.stream}
    try:
        return ctx.prepare(P.parse_chat_request(json.dumps(body).encode()), front)
    except P.APIError as err:
        raise GraftConfigError(f"trace record {index + 1} (in arrival order) cannot be replayed "
                               f"on this model: {err}") from None


def _shaped_messages(ctx, record: TraceRecord, rng: random.Random) -> list[dict]:
    """A chat of the recorded shape for a record without content: random tokens of about the
    recorded prompt length, and a stand-in image per recorded one, the same stand-in for the
    same sha256 (so the encoder cache sees the trace's repeats)."""
    from graft.tune.synth import stand_in_images, stand_in_text_tokens

    vocab, n = len(ctx.tokenizer), stand_in_text_tokens(record)
    text = ctx.tokenizer.decode([rng.randrange(vocab) for _ in range(n)],
                                skip_special_tokens=True)
    parts = stand_in_images(record.images) + [{"type": "text", "text": text or "hello"}]
    return [{"role": "user", "content": parts}]
