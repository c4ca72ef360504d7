"""What a chat request's tools mean: a ToolPlan (which tools the prompt gets, which JSON schema
the output must match for tool_choice "required" and a named function, which reader parses
the output), the checks that need more than one field, and the schema as guided_json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from graft.errors import GraftError
from graft.serving.http.openai.openai_chat import APIError

EMPTY_PARAMETERS = {"type": "object", "properties": {}}  # a function that takes no arguments


@dataclass
class ToolPlan:
    mode: str  # none | auto | required | named
    tools: list[dict]  # OpenAI tool dicts for the prompt ([] with mode none)
    named: str | None = None  # the function tool_choice names
    parallel: bool = True  # parallel_tool_calls: more than one call per answer

    @property
    def names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]

    def parameters(self, name: str) -> dict:
        tool = next(t for t in self.tools if t["function"]["name"] == name)
        return tool["function"].get("parameters") or EMPTY_PARAMETERS

    def schema(self) -> dict | None:
        """The JSON schema the output must match (guided_json), or None (free text).
        required: an array of {name, arguments} calls, one of the tools each; named: that
        function's arguments object alone (its name is known), as vLLM does."""
        if self.mode == "named":
            return self.parameters(self.named)
        if self.mode != "required":
            return None
        calls = [{"type": "object", "additionalProperties": False,
                  "required": ["name", "arguments"],
                  "properties": {"name": {"const": name}, "arguments": self.parameters(name)}}
                 for name in self.names]
        array: dict[str, Any] = {"type": "array", "minItems": 1,
                                 "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel:
            array["maxItems"] = 1
        return array


def plan_tools(req) -> ToolPlan:
    """The ToolPlan of a ChatCompletionRequest; APIError(400) naming the field when the
    tools or tool_choice cannot be honoured."""
    tools = req.tools or []
    choice = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    mode = choice if isinstance(choice, str) else "named"
    if mode != "none" and not tools:
        raise APIError(f"tool_choice {_show(choice)} needs tools; send the functions in "
                       "'tools' or drop tool_choice", param="tool_choice",
                       code="invalid_tool_choice")
    seen: set[str] = set()
    for k, tool in enumerate(tools):
        if tool.function.name in seen:
            raise APIError(f"tools[{k}].function.name {tool.function.name!r} is given twice; "
                           "function names must be unique", param=f"tools[{k}].function.name",
                           code="invalid_value")
        seen.add(tool.function.name)
    if mode == "named" and choice.function.name not in seen:
        raise APIError(f"tool_choice names function {choice.function.name!r}, which is not in "
                       f"tools ({', '.join(sorted(seen))})", param="tool_choice.function.name",
                       code="invalid_tool_choice")
    dicts = [t.model_dump(exclude_none=True) for t in tools] if mode != "none" else []
    return ToolPlan(mode, dicts, choice.function.name if mode == "named" else None,
                    req.parallel_tool_calls is not False)


def _show(choice) -> str:
    return repr(choice) if isinstance(choice, str) else f"{{function: {choice.function.name!r}}}"


def guide(params, req):
    """SamplingParams `params` with the output schema of the request's tool_choice (if any)
    as guided_json."""
    schema = plan_tools(req).schema() if getattr(req, "tools", None) else None
    if schema is None:
        return params
    if req.response_format is not None and req.response_format.type != "text":
        raise APIError("tool_choice 'required' or a named function constrains the output to "
                       "tool calls; it cannot also follow response_format: send one of them",
                       param="response_format", code="invalid_value")
    try:
        return dataclasses.replace(params, guided_json=schema)
    except GraftError as err:  # a parameters schema the grammar engine cannot compile
        detail = str(err).removeprefix("SamplingParams.guided_json ")
        raise APIError(f"tools: a function's `parameters` {detail} (tool_choice needs it as "
                       "the output's schema)", param="tools", code="invalid_value") from None


def arguments_object(text: str, where: str) -> dict:
    """A tool call's `arguments` text as the dict templates expect; APIError naming `where`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise APIError(f"{where} is not valid JSON ({err}); send the arguments object as a "
                       "JSON string", param=where, code="invalid_value") from None
    if not isinstance(value, dict):
        raise APIError(f"{where} must be a JSON object, got {type(value).__name__}",
                       param=where, code="invalid_value")
    return value
