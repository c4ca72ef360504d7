"""`tools` and `tool_choice` of a chat request and `tool_calls` in its history: OpenAI's
shapes, validated field by field (what they mean for a request: tool_plan.py)."""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function names


class _Strict(BaseModel):
    # as openai_chat's request models: unknown fields ignored, known ones typed strictly
    model_config = ConfigDict(extra="ignore", strict=True)


class FunctionDef(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: Any) -> Any:
        if value is not None and value.get("type", "object") != "object":
            raise ValueError("must be a JSON schema with \"type\": \"object\" (arguments are "
                             "a JSON object)")
        return value


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Union[Literal["none", "auto", "required"], NamedToolChoice]


class CalledFunction(_Strict):
    name: str
    arguments: str  # a JSON object, as text (what OpenAI returned)


class ToolCallIn(_Strict):
    """One entry of an assistant message's `tool_calls` in the history."""
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction
