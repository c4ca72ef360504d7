"""/openapi.json for the chat route: the handler reads its body itself (size limit, parsing
off the event loop), so the request and response models are added to the schema here."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from graft.serving.http.protocol import ChatCompletionRequest

CHAT_PATH = "/v1/chat/completions"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None  # stop | length | deadline (graft: the TTFT budget ran out)


class ChatCompletion(BaseModel):
    """A non-streaming answer (`protocol.completion_body` builds it)."""
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every 4xx/5xx body."""
    error: ErrorDetail


def install(app: FastAPI) -> None:
    """Make app.openapi() describe the chat route's request and responses."""
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

        op = schema["paths"][CHAT_PATH]["post"]
        op["requestBody"] = {"required": True, **json_of(ChatCompletionRequest, "")}
        op["requestBody"].pop("description")
        error = json_of(ErrorBody, "OpenAI-style error")
        op["responses"] = {
            "200": {**json_of(ChatCompletion, "the completion (stream: false)"),
                    "description": "the completion; with stream: true, text/event-stream "
                                   "chunks ending in `data: [DONE]`"},
            **{code: error for code in ("400", "401", "404", "413", "429", "500", "503")}}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
