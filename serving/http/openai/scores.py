"""vLLM's scoring API with an embedding model (a bi-encoder): /v1/rerank (also /rerank and
/v2/rerank: Jina's and Cohere's shape) orders documents by their similarity to a query, and
/v1/score (also /score) scores text pairs. Each text is embedded as /v1/embeddings embeds it
(its own engine request, pooled as `graft serve --pooling` says), and a pair's score is the
cosine of its two vectors, as vLLM scores with an embedding model."""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, PrivateAttr, model_validator

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.embeddings_answer import embed_all
from graft.serving.http.openai.embeddings_request import MAX_INPUTS, EmbeddingRequest

Int = P.Int
Texts = str | list[str]


class _Scoring(P._Strict):
    model: str
    truncate_prompt_tokens: Int | None = Field(default=None, ge=-1)  # per text, as embeddings
    priority: Int = Field(default=0, ge=-(2 ** 31), le=2 ** 31 - 1)
    ttft_budget_ms: float | None = Field(default=None, gt=0.0)


class RerankRequest(_Scoring):
    query: str
    documents: list[str] = Field(min_length=1, max_length=MAX_INPUTS - 1)
    top_n: Int = Field(default=0, ge=0)  # the best n results (0: all)
    top_k: Int | None = Field(default=None, ge=0)  # SGLang's name for top_n
    return_documents: bool = True  # Cohere's: each result carries its document's text
    rid: Any = None  # SGLang's request id (its protocol's mark, below)
    user: str | None = None
    # SGLang's worker protocol, which sglang-router and vllm-router speak to a worker's
    # /v1/rerank: the body holds `rid` (null or not), vllm-router names the model "default",
    # and the answer is a bare list of {score, document, index, meta_info}
    _sglang: bool = PrivateAttr(default=False)

    def texts(self) -> list[tuple[str, str]]:
        return [("query", self.query)] + [(f"documents[{i}]", d)
                                          for i, d in enumerate(self.documents)]


def parse_rerank(raw: bytes, served: list[str]) -> RerankRequest:
    """The RerankRequest of a POST body (400 naming the field), in SGLang's protocol when it
    holds `rid`; there a model this server does not serve is its one model, if it has one
    (vllm-router sends "default" whatever the client asked)."""
    req = P.parse_chat_request(raw, model=RerankRequest)
    body = json.loads(raw)  # (valid JSON: parsed above)
    req._sglang = "rid" in body
    if req._sglang and req.model not in served and len(served) == 1:
        req.model = served[0]
    return req


class ScoreRequest(_Scoring):
    # one side of one text scores against every text of the other, else the lists pair up
    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None  # vLLM's newer names for the same
    documents: Texts | None = None

    @model_validator(mode="after")
    def _one_pair(self) -> "ScoreRequest":
        names = [n for n in ("text_1", "text_2", "queries", "documents")
                 if getattr(self, n) is not None]
        if names not in (["text_1", "text_2"], ["queries", "documents"]):
            raise ValueError("send text_1 and text_2 (or queries and documents), one pair")
        a, b = self.sides()
        if 1 not in (len(a[1]), len(b[1])) and len(a[1]) != len(b[1]):
            raise ValueError(f"{a[0]} has {len(a[1])} texts and {b[0]} {len(b[1])}; send one "
                             "text on a side, or as many on both")
        if not a[1] or not b[1] or len(a[1]) + len(b[1]) > MAX_INPUTS:
            raise ValueError(f"send 1 to {MAX_INPUTS} texts in all, at least one a side")
        return self

    def sides(self) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        first, second = ("text_1", "text_2") if self.text_1 is not None else ("queries",
                                                                              "documents")
        as_list = lambda v: [v] if isinstance(v, str) else list(v)  # noqa: E731
        return ((first, as_list(getattr(self, first))), (second, as_list(getattr(self, second))))

    def texts(self) -> list[tuple[str, str]]:
        (n1, t1), (n2, t2) = self.sides()
        return ([(f"{n1}[{i}]", t) for i, t in enumerate(t1)]
                + [(f"{n2}[{i}]", t) for i, t in enumerate(t2)])

    def pairs(self) -> list[tuple[int, int]]:
        """(first text, second text) of each score, as indices into texts()."""
        (_, t1), (_, t2) = self.sides()
        n = max(len(t1), len(t2))
        return [(0 if len(t1) == 1 else i, len(t1) + (0 if len(t2) == 1 else i))
                for i in range(n)]


async def _vectors(ctx, request: Request, req, front, arrival: float):
    """(unit vector of each of req's texts, each text's prompt tokens), or the Response of a
    failure."""
    parts = []
    for param, text in req.texts():
        if not text:
            raise P.APIError(f"{param} is empty; send some text", param=param,
                             code="invalid_value")
        part = EmbeddingRequest(model=req.model, input=text, priority=req.priority,
                                truncate_prompt_tokens=req.truncate_prompt_tokens,
                                ttft_budget_ms=req.ttft_budget_ms)
        part._param = param
        parts.append(part)
    found = await embed_all(ctx, request, parts, front, arrival)
    if isinstance(found, Response):
        return found
    bodies, tokens = found
    vectors = np.array([b["embedding"] for b in bodies], dtype=np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors, tokens


async def rerank(ctx, request: Request, req: RerankRequest, front, arrival: float) -> Response:
    found = await _vectors(ctx, request, req, front, arrival)
    if isinstance(found, Response):
        return found
    vectors, tokens = found
    scores = vectors[1:] @ vectors[0]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n or req.top_k or None]
    if req._sglang:
        return JSONResponse([{"score": float(scores[i]), "index": i,
                              "document": req.documents[i] if req.return_documents else None,
                              "meta_info": {"prompt_tokens": tokens[0] + tokens[i + 1]}}
                             for i in order])
    results = [{"index": i, "relevance_score": float(scores[i]),
                "document": {"text": req.documents[i]} if req.return_documents else None}
               for i in order]
    return JSONResponse({"id": f"rerank-{secrets.token_hex(12)}", "model": req.model,
                         "usage": {"prompt_tokens": sum(tokens), "total_tokens": sum(tokens)},
                         "results": results})


async def score(ctx, request: Request, req: ScoreRequest, front, arrival: float) -> Response:
    found = await _vectors(ctx, request, req, front, arrival)
    if isinstance(found, Response):
        return found
    vectors, tokens = found
    data = [{"index": k, "object": "score", "score": float(vectors[a] @ vectors[b])}
            for k, (a, b) in enumerate(req.pairs())]
    return JSONResponse({"id": f"score-{secrets.token_hex(12)}", "object": "list",
                         "created": int(time.time()), "model": req.model, "data": data,
                         "usage": {"prompt_tokens": sum(tokens), "completion_tokens": 0,
                                   "total_tokens": sum(tokens)}})
