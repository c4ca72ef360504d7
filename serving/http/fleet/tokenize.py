"""vLLM's tokenizer endpoints, as routers call them: POST /tokenize and /detokenize, and
POST /v1/chat/completions/render, /v1/completions/render and /v1/responses/render (the prompt
ids a request would run with, in vLLM's GenerateRequest shape). Chats go through the same
validation and template as /v1/chat/completions, images included, so the ids are the ones the
engine prefills; an image's placeholder run is reported as `placeholder_id` (see
`wire_ids`)."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from typing import Any

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.completions_request import CompletionRequest, Prompt

Int = P.Int


class RenderChatRequest(P.ChatCompletionRequest):
    """A chat request as vLLM's render and tokenize take it: `model` may be left out."""
    model: str | None = None


class TokenizeChatRequest(RenderChatRequest):
    add_special_tokens: bool = False  # vLLM's default for chats (the template adds them)
    return_token_strs: bool = False


class TokenizeCompletionRequest(P._Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(P._Strict):
    model: str | None = None
    tokens: list[Int]


class RenderCompletionRequest(CompletionRequest):
    model: str | None = None
    prompt: Prompt


def placeholder_id(ctx) -> int:
    """The id an image position is reported as: the first id past the model's embedding
    rows, so it is never a text token, and non-negative, so routers that read ids as u32
    (vllm-router, llm-d) accept it. vLLM reports the model's own image token there; graft's
    LLM has none (its vocabulary is never extended), and inside the engine the run is
    graft.inject.IMAGE_PLACEHOLDER."""
    return ctx.engine.runner.vocab_size


def wire_ids(ctx, ids: list[int]) -> list[int]:
    from graft.inject import IMAGE_PLACEHOLDER

    image = placeholder_id(ctx)
    return [image if t == IMAGE_PLACEHOLDER else t for t in ids]


def _served(ctx, model: str | None) -> tuple[str, object]:
    """(served model name, its multimodal front); vLLM answers an unknown model with 404."""
    name = model or ctx.settings.model_name
    if name not in ctx.models:
        raise P.APIError(f"model {name!r} does not exist; this server serves "
                         f"{', '.join(map(repr, ctx.models))} (see /v1/models)", status=404,
                         type="not_found_error", param="model", code="model_not_found")
    return name, ctx.models[name]


async def _engine_request(ctx, req, front):
    """The EngineRequest /v1/chat/completions would submit for `req` (images fetched and
    sized on the same pools as there)."""
    from graft.serving.http.openai.chat_request import prepare_pool

    return await asyncio.get_running_loop().run_in_executor(prepare_pool(ctx, req),
                                                            ctx.prepare, req, front)


def _features(er) -> dict[str, Any] | None:
    """vLLM's MultiModalFeatures: per modality the items' hashes (graft's encoder-cache keys:
    pixels + preprocessing + encoder + adapter) and placeholder ranges."""
    if er.prepared is None or not er.prepared.images:
        return None
    return {"mm_hashes": {"image": [im.key for im in er.prepared.images]},
            "mm_placeholders": {"image": [{"offset": o, "length": n}
                                          for o, n in er.prepared.spans]},
            "kwargs_data": None}


def _sampling_params(params) -> dict[str, Any]:
    """The SamplingParams fields graft and vLLM share (vLLM sends its whole msgspec struct)."""
    stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or ())
    return {"n": 1, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "seed": params.seed,
            "max_tokens": params.max_tokens, "min_tokens": params.min_tokens, "stop": stop,
            "stop_token_ids": list(params.stop_token_ids), "ignore_eos": params.ignore_eos,
            "logprobs": params.logprobs, "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "repetition_penalty": params.repetition_penalty,
            "skip_special_tokens": params.skip_special_tokens,
            "include_stop_str_in_output": params.include_stop_str_in_output}


def _generate_request(ctx, name: str, er, priority: int) -> dict[str, Any]:
    """One vLLM GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py)."""
    return {"request_id": uuid.uuid4().hex, "token_ids": wire_ids(ctx, er.ids),
            "features": _features(er), "sampling_params": _sampling_params(er.params),
            "model": name, "stream": False, "stream_options": None, "cache_salt": None,
            "priority": priority, "kv_transfer_params": None}


async def render_chat(ctx, raw: bytes) -> dict[str, Any]:
    req = P.parse_chat_request(raw, RenderChatRequest)
    name, front = _served(ctx, req.model)
    req.model = name
    return _generate_request(ctx, name, await _engine_request(ctx, req, front), req.priority)


async def render_completion(ctx, raw: bytes) -> list[dict[str, Any]]:
    """A list, one GenerateRequest per prompt, as vLLM answers."""
    req = P.parse_chat_request(raw, RenderCompletionRequest)
    name, _ = _served(ctx, req.model)
    req.model = name
    return [_generate_request(ctx, name, await _engine_request(ctx, part, None), req.priority)
            for part in req.prompt_requests()]


async def render_responses(ctx, raw: bytes) -> dict[str, Any]:
    """vLLM's /v1/responses/render: the GenerateRequest of the chat a Responses request means
    (a kept conversation included, as /v1/responses would run it)."""
    from graft.serving.http.openai.responses_request import (in_responses_words,
                                                              parse_responses_request)

    req = parse_responses_request(raw, ctx.responses)
    name, front = _served(ctx, req.model)
    try:
        er = await _engine_request(ctx, req, front)
    except P.APIError as err:
        raise in_responses_words(err, req._origins) from None
    return _generate_request(ctx, name, er, req.priority)


async def tokenize(ctx, raw: bytes) -> dict[str, Any]:
    """vLLM's TokenizeResponse for a chat (`messages`) or a plain prompt (`prompt`)."""
    chat = _is_chat(raw)
    req = P.parse_chat_request(raw, TokenizeChatRequest if chat else TokenizeCompletionRequest)
    name, front = _served(ctx, req.model)
    if chat:
        req.model = name
        ids = (await _engine_request(ctx, req, front)).ids
    else:
        from graft.serving.http.openai.chat_request import check_text_length

        check_text_length(ctx, len(req.prompt), "prompt")
        ids = await asyncio.to_thread(
            lambda: ctx.tokenizer(req.prompt, add_special_tokens=req.add_special_tokens)
            ["input_ids"])
    ids = wire_ids(ctx, ids)
    strs = None
    if req.return_token_strs:
        image = placeholder_id(ctx)
        strs = [P.IMAGE_MARKER if t == image else ctx.tokenizer.convert_ids_to_tokens(t)
                for t in ids]
    return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids,
            "token_strs": strs}


def _is_chat(raw: bytes) -> bool:
    """vLLM's TokenizeRequest is a union told apart by `messages` (a body that does not
    parse is refused by the parser, naming the problem)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # the parser then refuses it, naming the problem
        return False
    return isinstance(data, dict) and "messages" in data


def detokenize(ctx, raw: bytes) -> dict[str, Any]:
    """vLLM's DetokenizeResponse; an image run (as /tokenize reports it) reads as one
    `<image>` marker, the way the chat's text had it."""
    req = P.parse_chat_request(raw, DetokenizeRequest)
    _served(ctx, req.model)
    vocab, image = ctx.engine.runner.vocab_size, placeholder_id(ctx)
    for i, tid in enumerate(req.tokens):
        if not (0 <= tid < vocab or tid == image):
            raise P.APIError(f"tokens[{i}] = {tid} is not a token id of this model (0 to "
                             f"{vocab - 1}, or {image} for an image position)",
                             param=f"tokens[{i}]", code="invalid_value")
    pieces = [P.IMAGE_MARKER if is_image else ctx.tokenizer.decode(list(run))
              for is_image, run in itertools.groupby(req.tokens, lambda t: t == image)]
    return {"prompt": "".join(pieces)}
