"""/openapi.json: the chat and completions handlers read their bodies themselves (size limit,
parsing off the event loop) and the other routes answer plain dicts or text, so every route's
request and response models are added to the schema here (schemathesis checks answers against
them)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from graft.serving.http.openai.completions_request import CompletionRequest
from graft.serving.http.openai.embeddings_request import EmbeddingRequest
from graft.serving.http.openai.scores import RerankRequest, ScoreRequest
from graft.serving.http.openai.openai_chat import ChatCompletionRequest
from graft.serving.http.openai.responses_request import ResponsesBody

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
RESPONSES_PATH = "/v1/responses"
EMBEDDINGS_PATH = "/v1/embeddings"
RERANK_PATH = "/v1/rerank"
SCORE_PATH = "/v1/score"
# every status the chat route may refuse with (all with ErrorBody): bad request, key, a
# forbidden image source, unknown model, body timeout, size, a body that is not JSON, a Host
# not served (request_guard.py), rate/queue limit, engine failure, connection limit or
# engine down
ERROR_STATUSES = ("400", "401", "403", "404", "408", "413", "415", "421", "429", "500", "503")


# one server-sent event: `data` is a chunk (chat.completion.chunk or text_completion) as
# JSON, the last one `[DONE]`
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens not computed for this request (prefix cache, transfer)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CalledFunction(BaseModel):
    name: str
    arguments: str  # a JSON object as text


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None  # None: only tool calls
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    # stop | length | tool_calls | deadline (graft: the TTFT budget ran out)
    finish_reason: str | None
    # vLLM's: the stop token id or stop string that ended it (null: eos, a length cut, ...)
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's, with the request's return_token_ids


class ChatCompletion(BaseModel):
    """A non-streaming answer (`response_bodies.completion_body` builds it)."""
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    # vLLM's, with the request's prompt_logprobs: per prompt token None (the first) or
    # {token id: {logprob, rank, decoded_token}}
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None
    prompt_token_ids: list[int] | None = None  # vLLM's, with the request's return_token_ids


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None  # tokens, token_logprobs, top_logprobs, text_offset
    finish_reason: str | None
    prompt_logprobs: list[dict[str, dict[str, Any]] | None] | None = None  # as ChatCompletion's
    stop_reason: int | str | None = None  # as Choice's
    token_ids: list[int] | None = None  # with return_token_ids, as Choice's
    prompt_token_ids: list[int] | None = None  # with return_token_ids: this choice's prompt


class TextCompletion(BaseModel):
    """A non-streaming /v1/completions answer (completions_answer.CompletionAnswer)."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class ResponseObject(BaseModel):
    """A non-streaming /v1/responses answer (responses_answer.response_object)."""
    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete"]
    model: str
    output: list[dict[str, Any]]  # reasoning, message and function_call items
    usage: dict[str, Any] | None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # str: encoding_format base64 (little-endian float32)


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """A /v1/embeddings answer (embeddings_answer.answer)."""
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None  # None: return_documents false


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankList(BaseModel):
    """A /v1/rerank answer (scores.rerank): the documents, the most similar first."""
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class Score(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreList(BaseModel):
    """A /v1/score answer (scores.score)."""
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[Score]
    usage: EmbeddingUsage


class DeletedResponse(BaseModel):
    """DELETE /v1/responses/{response_id}."""
    id: str
    object: Literal["response.deleted"]
    deleted: bool


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str  # vLLM's: the dir served (a graft's run dir, else the LLM's)
    parent: str | None = None  # vLLM's: null (a graft is served whole, not as an adapter)
    max_model_len: int  # vLLM's: the context length a request may fill
    # llama.cpp's names: "completion", and "multimodal" where the model takes images
    capabilities: list[Literal["completion", "multimodal"]]


class ModelList(BaseModel):
    """GET /v1/models."""
    object: Literal["list"]
    data: list[Model]


class Health(BaseModel):
    """GET /health: "ok", or (503) why not."""
    status: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every 4xx/5xx body."""
    error: ErrorDetail


def install(app: FastAPI, dependencies: list) -> None:
    """Make app.openapi() describe every route's request and responses, and serve it (with
    the Swagger UI at /docs and ReDoc at /redoc) under `dependencies` (the API key)."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})

        def ref(model: type[BaseModel]) -> dict[str, str]:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
            return {"$ref": f"#/components/schemas/{model.__name__}"}

        def json_of(model: type[BaseModel], description: str) -> dict[str, Any]:
            return {"description": description, "content": {"application/json": {
                "schema": ref(model)}}}

        error = json_of(ErrorBody, "OpenAI-style error")
        errors = {code: error for code in ERROR_STATUSES}
        for path, request, response in ((CHAT_PATH, ChatCompletionRequest, ChatCompletion),
                                        (COMPLETIONS_PATH, CompletionRequest, TextCompletion),
                                        (RESPONSES_PATH, ResponsesBody, ResponseObject)):
            op = schema["paths"][path]["post"]
            op["requestBody"] = {"required": True, **json_of(request, "")}
            op["requestBody"].pop("description")
            completion = json_of(response, "the completion (stream: false)")
            # the schema of one event, as SSE-aware clients and checkers read a stream
            # (schemathesis validates each event; {"type": "string"} failed every stream)
            completion["content"]["text/event-stream"] = {"schema": SSE_EVENT}
            completion["description"] = (
                "the response; with stream: true, text/event-stream events ending in "
                "response.completed" if path == RESPONSES_PATH else "the completion; with "
                "stream: true, text/event-stream chunks ending in `data: [DONE]`")
            op["responses"] = {"200": completion, **errors}
        for path, request, response, what in (
                (EMBEDDINGS_PATH, EmbeddingRequest, EmbeddingList, "the embeddings, in order"),
                (RERANK_PATH, RerankRequest, RerankList, "the documents, most similar first"),
                (SCORE_PATH, ScoreRequest, ScoreList, "the pairs' scores, in order")):
            op = schema["paths"][path]["post"]
            op["requestBody"] = {"required": True, "content": json_of(request, "")["content"]}
            op["responses"] = {"200": json_of(response, what), **errors}
        kept = schema["paths"][RESPONSES_PATH + "/{response_id}"]
        kept["get"]["responses"] = {"200": json_of(ResponseObject, "a kept response"),
                                    "401": error, "404": error}
        kept["delete"]["responses"] = {"200": json_of(DeletedResponse, "it is gone"),
                                       "401": error, "404": error}
        for op in kept.values():  # the ids responses_answer gives (any other is a 404)
            op["parameters"][0]["schema"].update(pattern="^resp_[0-9a-f]{24}$")
        schema["paths"]["/v1/models"]["get"]["responses"] = {
            "200": json_of(ModelList, "the served models"), "401": error, "503": error}
        # /health and /metrics: 401 only with --auth-health / --auth-metrics
        health = json_of(Health, "engine thread state")
        schema["paths"]["/health"]["get"]["responses"] = {
            "200": health, "503": health, "401": error}
        schema["paths"]["/metrics"]["get"]["responses"] = {
            "200": {"description": "Prometheus text format", "content": {
                "text/plain": {"schema": {"type": "string"}}}}, "401": error}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
    docs = APIRouter(dependencies=dependencies)

    @docs.get("/openapi.json", include_in_schema=False)
    async def schema_json():
        return JSONResponse(app.openapi())

    @docs.get("/docs", include_in_schema=False)
    async def swagger():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - docs")

    @docs.get("/redoc", include_in_schema=False)
    async def redoc():
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - ReDoc")

    app.include_router(docs)
