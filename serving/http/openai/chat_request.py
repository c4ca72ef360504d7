"""One chat request from HTTP to the engine, in one direction: read and parse the body, find
the model, validate the prompt (text first, then images), build SamplingParams, submit the Job
(admission control, shrinking images to meet a budget where allowed). The route handler calls
`read_chat_request`, then `submit_chat`, then streams or completes; nothing here comes back
to the handler until the job is queued. docs/serving.md walks one parameter (max_tokens)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace

from fastapi import Request

from graft.errors import GraftError, RequestError
from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai import response_bodies as R
from graft.serving.http.job import Job
from graft.serving.http.fleet.encoder_peers import fetch_missing
from graft.serving.http.fleet.pd import pull, transfer_for
from graft.serving.http.openai.reasoning import end_token, thinking_format
from graft.serving.http.openai.responses import sink
from graft.serving.http.openai.sampling_knobs import bad_words_token_ids
from graft.serving.http.openai.tool_prompt import check_outside_text, tool_prompt
from graft.serving.http.openai.tool_plan import (check_output_schema, guide, guided_by_tools,
                                                 plan_tools, refusal)
from graft.serving.multimodal.media import load_image

_MAX_SHRINK_STEPS = 6  # downscale attempts before a budget refusal stands
# a refusal before the body was read: the rest of it must not be parsed as the next request
_CLOSE = {"Connection": "close"}


@dataclass
class EngineRequest:
    """What the engine gets for one chat: prompt ids, images, SamplingParams."""
    ids: list[int]
    prepared: object | None  # the multimodal front's PreparedPrompt (None: text only)
    messages: list[dict]  # the chat as the template saw it (kept to re-prompt after a shrink)
    params: object  # SamplingParams
    # encode_chat's template keywords (tools, the request's template controls)
    template: dict | None = None


async def read_chat_request(ctx, request: Request, parse=P.parse_chat_request):
    """(ChatCompletionRequest, the model's front) from the HTTP request (`parse`: the body's
    parser, /v1/completions has its own): a full queue refuses before the body is read, a big
    body is parsed off the event loop."""
    ctx.metrics.requests.inc()
    ctx.worker.check_queue_room()  # a full queue refuses before any parsing or image work
    raw = await _read_body(request, ctx.max_body_bytes, ctx.settings.request_body_timeout_s)
    req = parse(raw) if len(raw) < 65536 else await asyncio.to_thread(parse, raw)
    if req.model not in ctx.models:
        raise P.APIError(f"model {req.model!r} does not exist; this server serves "
                         f"{', '.join(map(repr, ctx.models))} (see /v1/models)", status=404,
                         type="not_found_error", param="model", code="model_not_found")
    ctx.metrics.grafts[req.model].requests.inc()
    return req, ctx.models[req.model]  # the graft this request asked for


async def submit_chat(ctx, req: P.ChatCompletionRequest, front, arrival: float):
    """(Job, its event queue) once the engine worker accepted it; image work runs in a thread."""
    transfer = transfer_for(ctx.kv_transfer, req)  # P/D fields: 400 before any work
    loop = asyncio.get_running_loop()
    er = await loop.run_in_executor(prepare_pool(ctx, req), ctx.prepare, req, front)
    budget_ms = req.ttft_budget_ms or ctx.settings.default_ttft_budget_ms
    shrink = req.shrink_images_to_budget
    if shrink is None:
        shrink = ctx.settings.shrink_images_to_budget
    kv_import = await pull(ctx, transfer.pull) if transfer.pull is not None else None
    if er.prepared is not None and er.prepared.images:
        await fetch_missing(ctx, front, er.prepared.images)  # other workers' encoder caches
    queue: asyncio.Queue = asyncio.Queue()
    cid = R.new_completion_id()
    for attempt in range(_MAX_SHRINK_STEPS + 1):
        job = Job(cid, er.ids, er.params, sink=sink(loop, queue), prepared=er.prepared,
                  arrival=arrival, deadline=arrival + budget_ms / 1000 if budget_ms else None,
                  priority=req.priority,
                  encode_tokens=front.uncached_tokens(er.prepared.images) if er.prepared else 0,
                  front=front, graft=req.model, request=req, kv_export=transfer.export,
                  kv_import=kv_import)
        try:
            ctx.worker.submit(job, budget_ms / 1000 if budget_ms else None)
            return job, queue
        except P.APIError as err:
            # Over budget: a native-resolution encoder can trade detail for tokens.
            if err.code != "ttft_budget_exceeded" or not shrink or not er.prepared \
                    or not er.prepared.images or attempt == _MAX_SHRINK_STEPS:
                raise
            smaller = await loop.run_in_executor(ctx.media_pool, _shrunk, ctx, req, er, front)
            if smaller is None:
                raise
            er = smaller


def prepare_pool(ctx, req: P.ChatCompletionRequest):
    """Where a request is prepared (to_engine_request): image work in its own pool, remote
    fetches in theirs (slow hosts never delay local images or text); text in the default."""
    urls = _image_urls(req)
    return ctx.image_pool(urls) if urls else None


def _image_urls(req: P.ChatCompletionRequest) -> list[str]:
    # a /v1/completions request has no messages (text only), nor has an embedding of `input`
    return [part.image_url.url for msg in getattr(req, "messages", None) or ()
            if isinstance(msg.content, list) for part in msg.content
            if getattr(part, "type", None) == "image_url"]


def to_engine_request(ctx, req: P.ChatCompletionRequest, front) -> EngineRequest:
    """Validate the chat through `front` (None: text only) and build its SamplingParams. The
    context-length check runs on the text first, before any image is fetched, decoded or
    sized, and again on the whole prompt."""
    from graft.template import ChatTemplateError, encode_chat

    messages, refs = P.to_chat_messages(req.messages)
    # the template also writes past thinking and its variables into the prompt
    check_text_length(ctx, sum(len(m["content"]) + len(m.get("reasoning") or "") for m in messages)
                      + len(json.dumps(req.chat_template_kwargs or {})))
    parse = ctx.settings.parse_special_tokens_in_text
    plan = plan_tools(req)
    check_output_schema(plan)  # before the prompt renders a schema that will be refused
    messages, tools = tool_prompt(ctx.tokenizer, messages, req.messages, plan, parse)
    if req.chat_template_kwargs:  # written by the template outside the messages too
        check_outside_text(ctx.tokenizer, [("chat_template_kwargs", json.dumps(
            req.chat_template_kwargs, ensure_ascii=False))], parse)
    template = req.template_options(tools)
    limit = ctx.settings.limit_images_per_prompt
    if refs and front is None:
        raise P.APIError("this model is text-only (served from an LLM dir, not a run dir); "
                         "remove the image_url parts", param=refs[0][0],
                         code="images_not_supported")
    if len(refs) > limit:
        raise P.APIError(f"{len(refs)} images in the prompt; this server accepts at most "
                         f"{limit} (--limit-images-per-prompt)", param="messages",
                         code="too_many_images")
    try:
        text = encode_chat(ctx.tokenizer, messages, [0] * len(refs),  # images: empty runs
                           parse_special_tokens=parse, **template)
        if front is None:
            ids = truncated(ctx, text.input_ids, req.truncate_prompt_tokens, "messages")
            check_room(ctx, len(ids), req.output_limit())
            return EngineRequest(ids, None, messages, sampling_params_for(ctx, req, len(ids)),
                                 template)
        check_room(ctx, len(text.input_ids), req.output_limit())
        images = [front.prepare_image(load_image(url, ctx.settings.media, param))
                  for param, url in refs]
        front.check_cache_room(images)
        prepared = front.prompt(messages, images, parse, template)
    except RequestError as err:
        raise P.APIError.from_request(err) from None
    except ChatTemplateError as err:
        where = "messages" if err.message_index is None else f"messages[{err.message_index}]"
        raise P.APIError(str(err), param=where, code="invalid_prompt") from None
    except GraftError as err:
        raise P.APIError(str(err), param="messages", code="invalid_prompt") from None
    ids = prepared.prompt_token_ids
    if len(truncated(ctx, ids, req.truncate_prompt_tokens, "messages")) < len(ids):
        raise P.APIError(f"truncate_prompt_tokens={req.truncate_prompt_tokens} would cut this "
                         f"chat of {len(ids)} tokens, images included, and only text-only "
                         "prompts are cut; send fewer turns or raise it",
                         param="truncate_prompt_tokens", code="invalid_value")
    return EngineRequest(ids, prepared, messages, sampling_params_for(ctx, req, len(ids)),
                         template)


def truncated(ctx, ids: list[int], keep: int | None, where: str, side: str = "left") -> list[int]:
    """vLLM's truncate_prompt_tokens: `keep` of the prompt's tokens (-1: the context's
    length), the last ones (side "left", what vLLM keeps of a prompt to continue) or the
    first; None: all of them. A 400 naming `where` when none is left."""
    if keep is not None:
        keep = ctx.max_model_len if keep == -1 else keep
        ids = ids[max(len(ids) - keep, 0):] if side == "left" else ids[:keep]
    if not ids:
        raise P.APIError(f"{where} has no tokens left (truncate_prompt_tokens=0, or text with "
                         "no tokens); send some text", param=where, code="invalid_value")
    return ids


def _shrunk(ctx, req: P.ChatCompletionRequest, er: EngineRequest, front) -> EngineRequest | None:
    """The request with its costliest image downscaled to fewer tokens, or None."""
    images = list(er.prepared.images)
    k = max(range(len(images)), key=lambda i: images[i].n_tokens)
    smaller = front.shrink_image(images[k])
    if smaller is None:
        return None
    images[k] = smaller
    prepared = front.prompt(er.messages, images, ctx.settings.parse_special_tokens_in_text,
                            er.template)
    ids = prepared.prompt_token_ids
    return EngineRequest(ids, prepared, er.messages, sampling_params_for(ctx, req, len(ids)),
                         er.template)


def check_text_length(ctx, chars: int, param: str = "messages") -> None:
    """400 for prompt text longer than any prompt of max_model_len tokens can be (the bound
    of context.prompt_char_bound), before the tokenizer spends seconds on megabytes."""
    if ctx.max_prompt_chars is not None and chars > ctx.max_prompt_chars:
        raise P.APIError(
            f"the {param} text is {chars} characters, more than fit in the model's context of "
            f"{ctx.max_model_len} tokens (at most {ctx.max_prompt_chars} characters); shorten it",
            param=param, code="context_length_exceeded")


def check_room(ctx, n_prompt: int, limit: int | None, param: str = "messages") -> int:
    """Tokens left for output after an n_prompt-token prompt; 400 (naming `param`, where the
    prompt came from) when there are none or fewer than max_tokens asks for."""
    room = ctx.max_model_len - n_prompt
    if room <= 0 or (limit is not None and limit > room):
        asked = f" + {limit} output tokens" if limit else ""
        raise P.APIError(
            f"prompt is {n_prompt} tokens{asked}, over the model's context of "
            f"{ctx.max_model_len} tokens; shorten the {param} or lower max_tokens",
            param=param, code="context_length_exceeded")
    return room


def sampling_params_for(ctx, req: P.ChatCompletionRequest, n_prompt: int):
    """max_tokens (or max_completion_tokens) if given, else all the room the context leaves."""
    from graft.serving import SamplingParams

    limit = req.output_limit()
    room = check_room(ctx, n_prompt, limit)
    model = ctx.settings.sampling_defaults  # the model's, for the fields the request left unset
    try:
        params = SamplingParams(
            temperature=req.or_default("temperature", model, 1.0),
            top_p=req.or_default("top_p", model, 1.0),
            top_k=req.or_default("top_k", model, 0) or 0, min_p=req.or_default("min_p", model, 0.0),
            max_tokens=limit or min(model.get("max_tokens", room), room),
            seed=req.seed,
            stop=req.stop_list(), ignore_eos=req.ignore_eos, logprobs=req.num_logprobs(),
            prompt_logprobs=req.num_prompt_logprobs(),
            stop_token_ids=req.stop_token_ids or [], skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            bad_words_token_ids=bad_words_token_ids(ctx.tokenizer, req.bad_words),
            speculative=req.speculative, **req.sampling_kwargs(model))
        params.check_vocab(ctx.engine.runner.vocab_size)
    except RequestError as err:  # the grammar compiler cannot run
        raise P.APIError.from_request(err) from None
    except GraftError as err:
        raise refusal(err, req=req) from None
    params = guide(params, req)  # tool_choice required / named: the output's JSON schema
    if params.guided_grammar is not None:
        fmt = thinking_format(ctx.settings.reasoning_parser, ctx.tokenizer, req, guided=True)
        if fmt is not None:  # the model thinks first: the grammar holds after its end tag
            params = replace(params, guided_after_token=end_token(ctx.tokenizer, fmt))
        try:  # the matcher is built here, off the engine's thread (a big schema: ~1 s)
            ctx.engine.grammar_tokenizer.prepare(params.guided_grammar)
        except GraftError as err:
            raise refusal(err, guided_by_tools(req), req) from None
    return params


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The POST body within `timeout_s` (408 after), refusing (413) before buffering more than
    `limit` bytes."""
    try:
        return await asyncio.wait_for(_read_capped(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise P.APIError(f"the request body did not arrive within {timeout_s:g} s",
                         status=408, code="request_timeout", headers=_CLOSE) from None


async def _read_capped(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise P.APIError(f"request body is {declared} bytes, over the limit of {limit}",
                         status=413, code="request_too_large", headers=_CLOSE)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise P.APIError(f"request body is over the limit of {limit} bytes", status=413,
                             code="request_too_large", headers=_CLOSE)
        chunks.append(chunk)
    return b"".join(chunks)
