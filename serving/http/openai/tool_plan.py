"""What a chat request's tools mean: a ToolPlan (which tools the prompt gets, which JSON schema
the output must match for tool_choice "required" and a named function, which reader parses
the output), the checks that need more than one field, and the schema as guided_json."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from graft.errors import GraftError, RequestError
from graft.serving.engine.grammar_check import GrammarLimitError
from graft.serving.engine.guided import json_grammar
from graft.serving.http.openai.openai_chat import APIError
from graft.serving.http.openai.sampling_knobs import request_param

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
        at = "/items/properties/arguments" if len(self.names) == 1 \
            else "/items/anyOf/{}/properties/arguments"
        calls = [{"type": "object", "additionalProperties": False,
                  "required": ["name", "arguments"],
                  "properties": {"name": {"const": name},
                                 "arguments": _rebased(self.parameters(name), at.format(k))}}
                 for k, name in enumerate(self.names)]
        array: dict[str, Any] = {"type": "array", "minItems": 1,
                                 "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not self.parallel:
            array["maxItems"] = 1
        return array


def _rebased(schema, at: str):
    """`schema` moved to JSON pointer `at` of a bigger one: its local $refs ("#/$defs/x",
    "#" for itself) are made to point where their targets now are."""
    if isinstance(schema, list):
        return [_rebased(v, at) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebased(v, at) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = "#" + at + ref[1:]
    return out


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
    fmt = req.response_format
    for field, sent in (("response_format", fmt is not None and fmt.type != "text"),
                        ("structured_outputs", req.structured_outputs is not None),
                        ("grammar", req.grammar is not None)):
        if sent:
            raise APIError("tool_choice 'required' or a named function constrains the output "
                           f"to tool calls; it cannot also follow {field}: send one of them",
                           param=field, code="invalid_value")
    return _compiled(lambda: dataclasses.replace(params, guided_json=schema))


def check_output_schema(plan: ToolPlan) -> None:
    """400 naming `tools` when the output schema (tool_choice required / named) cannot be
    compiled: before the prompt renders the tools (the verdict is cached for `guide`)."""
    schema = plan.schema()
    if schema is not None:
        _compiled(lambda: json_grammar(schema))


def _compiled(compile_it):
    """compile_it(), its refusal as the 400 (503: no compiler) of a tools schema."""
    try:
        return compile_it()
    except RequestError as err:  # the grammar compiler cannot run
        raise APIError.from_request(err) from None
    except GraftError as err:  # a parameters schema the grammar engine cannot compile
        raise refusal(err, tools=True) from None


def refusal(err: GraftError, tools: bool = False, req=None) -> APIError:
    """The 400 for a SamplingParams error ("SamplingParams.guided_json is ..."), naming the
    request field: `tools` when the schema is a function's parameters (tool_choice required
    or named), else the field of `req` (the request, None: not at hand) that SamplingParams'
    field came from (response_format, structured_outputs.regex, ...). A grammar over a
    limit is code schema_too_complex."""
    code = "schema_too_complex" if isinstance(err, GrammarLimitError) else "invalid_value"
    if tools:
        detail = str(err).removeprefix("SamplingParams.guided_json ")
        return APIError(f"tools: a function's `parameters` {detail} (tool_choice needs it as "
                        "the output's schema)", param="tools", code=code)
    param, message = request_param(str(err), req.request_fields() if req is not None else None)
    return APIError(message, param=param, code=code)


def guided_by_tools(req) -> bool:
    """Whether the request's output schema is its tools' (tool_choice required or named)."""
    return bool(getattr(req, "tools", None)) and plan_tools(req).schema() is not None


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
