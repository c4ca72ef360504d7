"""The OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/completions,
/v1/responses, /v1/embeddings, and vLLM's /v1/rerank and /v1/score (API key checked by the
dependency server.py attaches to this router)."""

from __future__ import annotations

import time
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.chat_answer import ChatAnswer
from graft.serving.http.openai.chat_request import read_chat_request, submit_chat
from graft.serving.http.openai.choices import answer_all, choice_requests, submit_all
from graft.serving.http.openai.completions_answer import CompletionAnswer
from graft.serving.http.openai.completions_request import parse_completion_request
from graft.serving.http.openai import embeddings_answer
from graft.serving.http.openai.embeddings_request import EmbeddingRequest
from graft.serving.http.openai import responses_answer
from graft.serving.http.openai import scores
from graft.serving.http.openai.openapi_schema import (CHAT_PATH, COMPLETIONS_PATH,
                                                      EMBEDDINGS_PATH, RERANK_PATH,
                                                      RESPONSES_PATH, SCORE_PATH)
from graft.serving.http.openai.responses_request import (in_responses_words, kept_response,
                                                          parse_responses_request)
from graft.serving.http.openai.responses import answer

router = APIRouter()


@router.get("/v1/models")
async def models(request: Request):
    # capabilities as llama.cpp's server names them: "multimodal" where the model takes images
    # (a graft's vision encoder), so a client (the chat page) can hide image input elsewhere
    # vLLM's fields too: root (the dir served: a graft's run dir, else the LLM's), parent
    # (null: a graft is served whole, not as an adapter of another entry), max_model_len
    ctx = request.app.state.ctx
    return {"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "graft",
         "root": str(front.run_dir if front is not None and front.run_dir else ctx.engine.model_dir),
         "parent": None, "max_model_len": ctx.max_model_len,
         "capabilities": ["completion", "multimodal"] if front else ["completion"]}
        for name, front in ctx.models.items()]}


@router.post(CHAT_PATH)
async def chat_completions(request: Request) -> Response:
    """Parse -> validate -> SamplingParams -> submit (chat_request.py), then answer."""
    return await _serve(request, P.parse_chat_request, ChatAnswer)


@router.post(COMPLETIONS_PATH)
async def completions(request: Request) -> Response:
    """The same way with a prompt instead of messages (completions_request.py)."""
    return await _serve(request, parse_completion_request, CompletionAnswer)


@router.post(RESPONSES_PATH)
async def responses(request: Request) -> Response:
    """OpenAI's Responses API: the chat it means (responses_request.py), its answer as a
    Response (responses_answer.py)."""
    arrival = time.monotonic()
    ctx = request.app.state.ctx
    req, front = await read_chat_request(ctx, request, partial(parse_responses_request,
                                                               store=ctx.responses))
    try:
        job, queue = await submit_chat(ctx, req, front, arrival)
    except P.APIError as err:  # the prompt's and the sampling's checks, in chat's words
        raise in_responses_words(err, req._origins) from None
    return await responses_answer.answer(ctx, request, job, queue, ChatAnswer(ctx, job, req), req)


@router.post(EMBEDDINGS_PATH)
async def embeddings(request: Request) -> Response:
    """One pooling request per input (embeddings_request.py), joined in one list
    (embeddings_answer.py)."""
    return await _pooled(request, partial(P.parse_chat_request, model=EmbeddingRequest),
                         embeddings_answer.answer)


@router.post(RERANK_PATH)
@router.post("/rerank", include_in_schema=False)
@router.post("/v2/rerank", include_in_schema=False)
async def rerank(request: Request) -> Response:
    """Documents by their embeddings' cosine with the query's (scores.py)."""
    served = list(request.app.state.ctx.models)
    return await _pooled(request, partial(scores.parse_rerank, served=served), scores.rerank)


@router.post(SCORE_PATH)
@router.post("/score", include_in_schema=False)
async def score(request: Request) -> Response:
    """Text pairs scored by their embeddings' cosine (scores.py)."""
    return await _pooled(request, partial(P.parse_chat_request, model=scores.ScoreRequest),
                         scores.score)


async def _pooled(request: Request, parse, answer) -> Response:
    arrival = time.monotonic()
    ctx = request.app.state.ctx
    req, front = await read_chat_request(ctx, request, parse)
    return await answer(ctx, request, req, front, arrival)


@router.get(RESPONSES_PATH + "/{response_id}")
async def get_response(response_id: str, request: Request):
    """A Response the server kept (--responses-store-mb)."""
    return kept_response(request.app.state.ctx.responses, response_id, "response_id")[0]


@router.delete(RESPONSES_PATH + "/{response_id}")
async def delete_response(response_id: str, request: Request):
    store = request.app.state.ctx.responses
    kept_response(store, response_id, "response_id")
    store.delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


async def _serve(request: Request, parse, shape) -> Response:
    arrival = time.monotonic()
    ctx = request.app.state.ctx
    req, front = await read_chat_request(ctx, request, parse)
    parts = choice_requests(req)  # n > 1, or a list of prompts: a request per choice
    if len(parts) > 1:
        subs = await submit_all(ctx, parts, front, arrival)
        shapes = [shape(ctx, job, part) for (job, _), part in zip(subs, parts)]
        return await answer_all(ctx, request, req, subs, shapes)
    job, queue = await submit_chat(ctx, parts[0], front, arrival)
    return await answer(ctx, request, job, queue, shape(ctx, job, parts[0]), req.stream,
                        req.stream_options)
