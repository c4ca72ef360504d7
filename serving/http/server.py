"""OpenAI-compatible HTTP server: parses, validates and streams; the engine runs elsewhere.

One background thread (EngineWorker) steps the engine; each request reads its outputs from
its own asyncio queue. Image fetching, decoding, hashing and tokenizing run off the loop.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from graft.errors import GraftError
from graft.serving.http import protocol as P
from graft.serving.http.engine_worker import EngineWorker, Job
from graft.serving.multimodal.media import MediaConfig, load_image
from graft.serving.http.metrics import ServerMetrics


_MAX_SHRINK_STEPS = 6  # downscale attempts before a budget refusal stands


@dataclass
class ServerSettings:
    model_name: str = "graft"  # the `model` clients must send (also listed by /v1/models)
    media: MediaConfig = field(default_factory=MediaConfig)  # image sources and limits
    limit_images_per_prompt: int = 4  # more image parts than this -> 400
    default_ttft_budget_ms: float | None = None  # budget for requests that give none
    encoder_tokens_per_step: int = 4096  # image tokens encoded between two engine steps
    admission_slack: float = 1.0  # >1 makes admission control more conservative
    shrink_images_to_budget: bool = False  # downscale native-resolution images to fit a budget
    disconnect_poll_s: float = 0.25  # how often a non-streaming request checks its client


class _Ctx:
    """Everything a handler needs; built once per app."""

    def __init__(self, engine, settings: ServerSettings):
        self.engine = engine
        self.front = getattr(engine, "mm", None)
        self.settings = settings
        self.tokenizer = self.front.tokenizer if self.front else engine.tokenizer
        self.max_model_len = engine.max_model_len
        # every allowed image as base64 (4/3) plus generous room for the text
        self.max_body_bytes = (settings.limit_images_per_prompt * settings.media.max_image_bytes
                               * 4 // 3 + (8 << 20))
        self.metrics = ServerMetrics({
            "graft_queue_depth": ("Requests waiting for their first token.",
                                  lambda: self.worker.queue_depth()),
            "graft_running_requests": ("Requests inside the engine.",
                                       lambda: self.worker.num_running()),
            "graft_kv_blocks_used": ("KV cache blocks in use.",
                                     lambda: self.kv_blocks()[0]),
            "graft_kv_blocks_total": ("KV cache blocks in the pool.",
                                      lambda: self.kv_blocks()[1]),
            "graft_encoder_cache_hit_rate": ("Encoder cache hits / lookups.",
                                             lambda: self._cache_stat("hit_rate")),
            "graft_encoder_cache_bytes": ("Bytes of embeddings in the encoder cache.",
                                          lambda: self._cache_stat("bytes")),
            "graft_encoder_cache_hits": ("Encoder cache hits.", lambda: self._cache_stat("hits")),
            "graft_encoder_cache_misses": ("Encoder cache misses.",
                                           lambda: self._cache_stat("misses")),
            "graft_encoder_cache_evictions": ("Encoder cache evictions.",
                                              lambda: self._cache_stat("evictions")),
        })
        self.grafts = getattr(engine, "grafts", None)  # several grafts over one LLM, or None
        # served model name -> its multimodal front (None: the bare LLM, text only)
        self.models = {settings.model_name: self.front}
        if self.grafts is not None:
            if settings.model_name in self.grafts:
                raise GraftError(f"model name {settings.model_name!r} names both the bare LLM "
                                 "and a graft; pick another --served-model-name or graft name")
            self.models.update(self.grafts.fronts)
        for name, front in self.models.items():
            self.metrics.add_graft(name, (lambda f=front: (f.hits, f.misses)) if front else None)
        self.worker = EngineWorker(engine, self.front, self.metrics,
                                   settings.encoder_tokens_per_step, settings.admission_slack,
                                   fronts=[f for f in self.models.values() if f is not None])

    def kv_blocks(self) -> tuple[int, int]:
        """(blocks in use, blocks in the pool)."""
        bm = self.engine.block_manager  # len()-based reads: safe beside the engine thread
        return bm.num_blocks - bm.num_free_blocks, bm.num_blocks

    def _cache_stat(self, name: str) -> float:
        cache = self.worker.cache
        return float(cache.stats()[name]) if cache is not None else 0.0

    # ---- request preparation (runs in a worker thread) -----------------------------------
    def prepare(self, req: P.ChatCompletionRequest, front):
        """(prompt ids, PreparedPrompt or None, messages) through `front` (None: text only)."""
        from graft.template import encode_chat

        messages, refs = P.to_chat_messages(req.messages)
        limit = self.settings.limit_images_per_prompt
        if refs and front is None:
            raise P.APIError("this model is text-only (served from an LLM dir, not a run dir); "
                             "remove the image_url parts", param=refs[0][0],
                             code="images_not_supported")
        if len(refs) > limit:
            raise P.APIError(f"{len(refs)} images in the prompt; this server accepts at most "
                             f"{limit} (--limit-images-per-prompt)", param="messages",
                             code="too_many_images")
        try:
            if front is None:
                chat = encode_chat(self.tokenizer, messages, [], add_generation_prompt=True)
                return chat.input_ids, None, messages
            images = [front.prepare_image(load_image(url, self.settings.media, param))
                      for param, url in refs]
            front.check_cache_room(images)
            prepared = front.prompt(messages, images)
        except GraftError as err:
            raise P.APIError(str(err), param="messages", code="invalid_prompt") from None
        return prepared.prompt_token_ids, prepared, messages

    def shrink(self, messages: list[dict], prepared, front):
        """The prompt with its costliest image downscaled to fewer tokens, or None."""
        images = list(prepared.images)
        k = max(range(len(images)), key=lambda i: images[i].n_tokens)
        smaller = front.shrink_image(images[k])
        if smaller is None:
            return None
        images[k] = smaller
        prepared = front.prompt(messages, images)
        return prepared.prompt_token_ids, prepared

    def logprobs(self, out, start: int, top: int) -> dict | None:
        """OpenAI logprobs of out's output tokens from index `start` on (None when off)."""
        if out.logprobs is None:
            return None
        ids = out.token_ids[start:len(out.logprobs)]
        return P.logprobs_body(ids, out.logprobs[start:start + len(ids)], top,
                               lambda t: self.tokenizer.decode([t]))

    def sampling_params(self, req: P.ChatCompletionRequest, n_prompt: int):
        from graft.serving import SamplingParams

        room = self.max_model_len - n_prompt
        limit = req.output_limit()
        if room <= 0 or (limit is not None and limit > room):
            asked = f" + {limit} output tokens" if limit else ""
            raise P.APIError(
                f"prompt is {n_prompt} tokens{asked}, over the model's context of "
                f"{self.max_model_len} tokens; shorten the messages or lower max_tokens",
                param="messages", code="context_length_exceeded")
        try:
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0, max_tokens=limit or room, seed=req.seed,
                stop=req.stop_list(), ignore_eos=req.ignore_eos, logprobs=req.num_logprobs())
        except GraftError as err:
            raise P.APIError(str(err), code="invalid_value") from None


def _sink(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    """Thread-safe hand-off from the engine thread to one request's queue."""
    def put(kind: str, payload) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
        except RuntimeError:  # loop closed (shutdown): nobody is listening any more
            pass
    return put


async def _read_body(request: Request, limit: int) -> bytes:
    """The POST body, refusing (413) before buffering more than `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise P.APIError(f"request body is {declared} bytes, over the limit of {limit}",
                         status=413, code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise P.APIError(f"request body is over the limit of {limit} bytes", status=413,
                             code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def _error_response(err: P.APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def build_app(engine, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app around a loaded engine (`engine.mm` set for a run dir)."""
    ctx = _Ctx(engine, settings or ServerSettings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await asyncio.to_thread(ctx.worker.warmup)
        ctx.worker.start()
        yield
        await asyncio.to_thread(ctx.worker.stop)

    app = FastAPI(title="graft", lifespan=lifespan)
    app.state.ctx = ctx

    @app.exception_handler(P.APIError)
    async def _api_error(request: Request, err: P.APIError):
        if err.status == 429:
            ctx.metrics.rejected_429.inc()
        elif 400 <= err.status < 500:
            ctx.metrics.errors_4xx.inc()
        return _error_response(err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        ctx.metrics.errors_4xx.inc()
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return _error_response(P.APIError(str(err.detail), status=err.status_code, type=kind))

    @app.get("/health")
    async def health():
        if not ctx.worker._thread.is_alive():
            return JSONResponse({"status": "engine thread stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                            "owned_by": "graft"} for name in ctx.models]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(ctx.metrics.render(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        arrival = time.monotonic()
        ctx.metrics.requests.inc()
        raw = await _read_body(request, ctx.max_body_bytes)
        # big bodies (base64 images) are parsed off the event loop too
        req = (P.parse_chat_request(raw) if len(raw) < 65536
               else await asyncio.to_thread(P.parse_chat_request, raw))
        if req.model not in ctx.models:
            raise P.APIError(f"model {req.model!r} does not exist; this server serves "
                             f"{', '.join(map(repr, ctx.models))} (see /v1/models)", status=404,
                             type="not_found_error", param="model", code="model_not_found")
        front = ctx.models[req.model]  # the graft this request asked for
        ctx.metrics.grafts[req.model].requests.inc()
        ids, prepared, messages = await asyncio.to_thread(ctx.prepare, req, front)
        budget_ms = req.ttft_budget_ms or ctx.settings.default_ttft_budget_ms
        shrink = req.shrink_images_to_budget
        if shrink is None:
            shrink = ctx.settings.shrink_images_to_budget
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cid = P.new_completion_id()
        for attempt in range(_MAX_SHRINK_STEPS + 1):
            job = Job(cid, ids, ctx.sampling_params(req, len(ids)), sink=_sink(loop, queue),
                      prepared=prepared, arrival=arrival,
                      deadline=arrival + budget_ms / 1000 if budget_ms else None,
                      encode_tokens=front.uncached_tokens(prepared.images) if prepared else 0,
                      front=front, graft=req.model)
            try:
                ctx.worker.submit(job, budget_ms / 1000 if budget_ms else None)
                break
            except P.APIError as err:
                # Over budget: a native-resolution encoder can trade detail for tokens.
                if err.status != 429 or not shrink or not prepared or not prepared.images \
                        or attempt == _MAX_SHRINK_STEPS:
                    raise
                smaller = await asyncio.to_thread(ctx.shrink, messages, prepared, front)
                if smaller is None:
                    raise
                ids, prepared = smaller
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_stream(ctx, job, queue, req.model, include_usage,
                                             req.top_logprobs or 0),
                                     media_type="text/event-stream")
        return await _complete(ctx, job, queue, req.model, request, req.top_logprobs or 0)

    return app


async def _complete(ctx: _Ctx, job: Job, queue: asyncio.Queue, model: str,
                    request: Request, top_logprobs: int) -> Response:
    text, n_out, reason, last = "", 0, None, None
    try:
        while True:
            try:
                kind, out = await asyncio.wait_for(queue.get(), ctx.settings.disconnect_poll_s)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    ctx.worker.abort(job.request_id)
                    return Response(status_code=499)
                continue
            if kind == "error":
                return _error_response(out)
            if kind == "deadline":
                reason = "deadline"
                break
            text, n_out, last = out.text, len(out.token_ids), out
            if out.finished:
                reason = out.finish_reason
                break
    except asyncio.CancelledError:
        ctx.worker.abort(job.request_id)
        raise
    logprobs = ctx.logprobs(last, 0, top_logprobs) if last is not None else None
    return JSONResponse(P.completion_body(job.request_id, model, text, reason,
                                          len(job.prompt_token_ids), n_out, logprobs))


async def _stream(ctx: _Ctx, job: Job, queue: asyncio.Queue, model: str, include_usage: bool,
                  top_logprobs: int):
    created = int(time.time())
    sent, n_out, done = 0, 0, False
    sent_lp = 0  # output tokens whose logprobs went out already
    try:
        yield P.sse(P.chunk_body(job.request_id, model, {"role": "assistant", "content": ""},
                                 None, created))
        while True:
            kind, out = await queue.get()
            if kind == "error":
                yield P.sse(out.body())
                done = True
                break
            if kind == "deadline":
                yield P.sse(P.chunk_body(job.request_id, model, {}, "deadline", created))
                done = True
                break
            n_out = len(out.token_ids)
            delta = out.text[sent:]
            sent = len(out.text)
            # logprobs ride with the text they belong to (stop-string hold-back delays both)
            logprobs = ctx.logprobs(out, sent_lp, top_logprobs) if delta or out.finished else None
            if logprobs is not None:
                sent_lp += len(logprobs["content"])
            if delta or (logprobs and logprobs["content"]):
                yield P.sse(P.chunk_body(job.request_id, model, {"content": delta}, None, created,
                                         logprobs))
            if out.finished:
                done = True
                yield P.sse(P.chunk_body(job.request_id, model, {}, out.finish_reason, created))
                break
        if include_usage:
            yield P.sse(P.usage_chunk_body(job.request_id, model, created,
                                           len(job.prompt_token_ids), n_out))
        yield P.sse("[DONE]")
    finally:
        if not done:  # client went away mid-stream: free its KV blocks and cache pins
            ctx.worker.abort(job.request_id)
