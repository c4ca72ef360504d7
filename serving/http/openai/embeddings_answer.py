"""POST /v1/embeddings, the answer: each input is its own engine request (a pooling one,
batched with everything else the engine runs), and the answer lists their vectors in input
order, as OpenAI's `list` of `embedding` objects with the prompt tokens summed. An input that
fails fails the answer and the others are aborted; so is everything when the client goes."""

from __future__ import annotations

import base64
import secrets
import time

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.choices import gather, submit_all
from graft.serving.http.openai.responses import error_response


class EmbeddingShape:
    """What responses.whole asks of one input's answer: its `embedding` object."""

    def __init__(self, index: int, encoding_format: str, param: str):
        self.index = index
        self.encoding_format = encoding_format
        self.param = param  # where the input is in the request, for a refusal

    def whole(self, last, reason: str | None) -> dict | Response:
        if reason == "stop" and last is not None and last.embedding is not None:
            return {"object": "embedding", "index": self.index,
                    "embedding": encode(last.embedding, self.encoding_format)}
        if reason == "deadline":
            return error_response(P.APIError(
                f"{self.param} was not embedded within its ttft_budget_ms; retry later or "
                "raise ttft_budget_ms", status=429, type="rate_limit_error",
                param="ttft_budget_ms", code="ttft_budget_exceeded"))
        why = (last.error if last is not None else None) or f"it ended with {reason!r}"
        return error_response(P.APIError(f"{self.param} could not be embedded: {why}",
                                         param=self.param, code="invalid_prompt"))


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """float: the numbers; base64: their little-endian float32 bytes (what the openai client
    asks for by default, and decodes with numpy)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


async def embed_all(ctx, request: Request, parts: list, front, arrival: float,
                    encoding_format: str = "float") -> tuple[list[dict], list[int]] | Response:
    """Submit each one-input EmbeddingRequest of parts: (their `embedding` objects in order,
    each one's prompt tokens) once all are embedded, or the Response that ends the answer."""
    subs = await submit_all(ctx, parts, front, arrival)
    shapes = [EmbeddingShape(i, encoding_format, part._param if part.input is not None
                             else "messages") for i, part in enumerate(parts)]
    data = await gather(ctx, request, subs, shapes)
    if isinstance(data, Response):
        return data
    return data, [len(job.prompt_token_ids) for job, _ in subs]


async def answer(ctx, request: Request, req, front, arrival: float) -> Response:
    """Submit every input of req (an EmbeddingRequest) and answer once all are embedded."""
    found = await embed_all(ctx, request, req.input_requests(), front, arrival,
                            req.encoding_format)
    if isinstance(found, Response):
        return found
    data, tokens = found
    prompt = sum(tokens)
    return JSONResponse({
        "id": f"embd-{secrets.token_hex(12)}", "object": "list", "created": int(time.time()),
        "model": req.model, "data": data,
        "usage": {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}})
