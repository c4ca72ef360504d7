"""OpenAI chat-completions request shapes, their validation, and error bodies (the answers'
bodies: response_bodies.py).

Every 4xx the server sends is an `APIError` rendered as {"error": {message, type, param, code}}.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag,
                      ValidationError, field_validator, model_validator)
from typing_extensions import Annotated

from graft.serving.engine.sampling_params import SEED_MAX, SEED_MIN
from graft.serving.http.openai.sampling_knobs import SamplingKnobs
from graft.serving.http.openai.tool_protocol import Tool, ToolCallIn, ToolChoice


class APIError(Exception):
    """An error the client caused (or a refusal): HTTP status + OpenAI-style body."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    STATUS = {"invalid": 400, "forbidden": 403, "too_large": 413, "overloaded": 429,
              "unavailable": 503}

    @classmethod
    def from_request(cls, err) -> "APIError":
        """The HTTP answer to a graft.errors.RequestError raised below the HTTP layer."""
        status = cls.STATUS[err.reason]
        kind = "server_error" if status == 503 else "invalid_request_error"
        return cls(err.message, status=status, type=kind, param=err.param, code=err.code)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class _Strict(BaseModel):
    # Unknown fields are ignored so newer OpenAI clients keep working; known ones are typed
    # as the OpenAI API types them: no coercion (`true` or "10" is not an int; 1 is a float).
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        # the openai client sends `"n": null` & co. for parameters it leaves unset: a null is
        # the field's default, never a refusal (a required field sent as null stays missing)
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data


def _integral(value: Any) -> Any:
    # JSON has one number type and JSON Schema's "integer" includes 8.0: take a float with
    # no fractional part as the int it is. Booleans and strings stay refused (strict).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]  # an OpenAI integer field


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURL(_Strict):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL


def _part_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return {"text": "TextPart", "image_url": "ImagePart"}.get(kind)


# Dispatch on "type" so a bad part reports its own fields, not every union branch's.
ContentPart = Annotated[Union[Annotated[TextPart, Tag("TextPart")],
                              Annotated[ImagePart, Tag("ImagePart")]], Discriminator(_part_kind)]


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant: the calls it made (tool_protocol)
    tool_call_id: str | None = None  # tool: the call this message answers
    # assistant: its thinking, as a --reasoning-parser answer gave it (vLLM also reads the
    # older name); templates that keep it (Qwen3's, in a tool loop) read `reasoning_content`
    reasoning: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """The text parts, joined as to_chat_messages joins them for the template (images left
        out)."""
        parts = self.content if isinstance(self.content, list) else [self.content or ""]
        return "\n".join(p if isinstance(p, str) else p.text for p in parts
                         if isinstance(p, str) or getattr(p, "text", None) is not None)

    @field_validator("content", mode="before")
    @classmethod
    def _parts_have_type(cls, value: Any) -> Any:
        if isinstance(value, list):
            for j, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in ("text", "image_url"):
                    raise ValueError(f"content[{j}].type must be 'text' or 'image_url', "
                                     f"got {kind!r}")
        return value


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage so far on every chunk


class SamplingFields(_Strict, SamplingKnobs):  # + logit_bias, penalties, response_format
    """What chat and text completions (completions_request.py) share: the model and how to
    sample, stream and budget the answer."""
    model: str
    max_tokens: Int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: Int | None = Field(default=None, ge=-1)  # vLLM-style extension; -1/0 = off
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)  # vLLM-style extension; 0 = off
    seed: Int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)  # what the sampler takes
    stop: Union[str, list[str], None] = None
    # vLLM's: token ids that end the answer (their text left out), the stop string kept in
    # the text, special tokens' text kept
    stop_token_ids: list[Annotated[Int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's: lower is admitted first among waiting requests (after first-token deadlines)
    priority: Int = Field(default=0, ge=-(2 ** 31), le=2 ** 31 - 1)
    n: Int = Field(default=1, ge=1, le=128)  # choices per prompt, each its own engine request
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's: each prompt token's logprob and this many likeliest alternatives
    prompt_logprobs: Int | None = Field(default=None, ge=0, le=20)
    # vLLM's: the prompt's and the answer's token ids beside the text (responses.py), and
    # logprobs' tokens written `token_id:N`
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: keep only the prompt's last k tokens (-1: the context's length); text-only
    truncate_prompt_tokens: Int | None = Field(default=None, ge=-1)
    # graft extension (pass with the openai client's extra_body): time to first token budget
    ttft_budget_ms: float | None = Field(default=None, gt=0.0)
    # graft extension: on a budget refusal, downscale native-resolution images and retry
    shrink_images_to_budget: bool | None = None
    ignore_eos: bool = False
    # graft extension: speculative decoding for this request (None: the server's --speculative)
    speculative: Literal["off", "ngram", "suffix"] | None = None
    # prefill/decode split (vllm-router's protocol; serving/http/fleet/pd.py): honoured or
    # refused, never ignored, as are sglang-router's bootstrap fields
    kv_transfer_params: dict[str, Any] | None = None
    bootstrap_host: Any = None
    bootstrap_port: Any = None
    bootstrap_room: Any = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        if "" in (value if isinstance(value, list) else [value]):
            raise ValueError("stop sequences must not be empty strings")
        return value

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs_whole(cls, value: Any, info) -> Any:
        if value is not None and info.data.get("stream"):
            raise ValueError("prompt_logprobs are not available with stream: true (as in "
                             "vLLM); ask without streaming")
        return value

    def prompt_requests(self) -> list:
        """One request per prompt (/v1/completions takes a list of them; a chat is one)."""
        return [self]

    def num_prompt_logprobs(self) -> int | None:
        """SamplingParams.prompt_logprobs for this request: None (off) or the top-k count."""
        return self.prompt_logprobs

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None  # function tools (tool_protocol.py, tool_prompt.py)
    tool_choice: ToolChoice | None = None  # none | auto | required | {function: {name}}
    parallel_tool_calls: bool | None = None
    # vLLM's chat-template controls (graft.template.encode_chat)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True  # with --reasoning-parser: false leaves `reasoning` out
    echo: bool = False  # vLLM's: the answer starts with the last message's text if assistant

    def echoed(self) -> str:
        """The text `echo` puts before the answer: the last message's, if the assistant's."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""

    @field_validator("continue_final_message")
    @classmethod
    def _one_ending(cls, value: bool, info) -> bool:
        if value and info.data.get("add_generation_prompt", True):
            raise ValueError("continue_final_message needs add_generation_prompt: false (the "
                             "prompt cannot both continue the last message and open a new turn)")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, value: dict | None) -> dict | None:
        from graft.template import RESERVED_TEMPLATE_KWARGS

        taken = sorted(RESERVED_TEMPLATE_KWARGS & set(value or ()))
        if taken:
            raise ValueError(f"{taken[0]!r} is set by the server, not a template variable; "
                             "use the request's own field or leave it out")
        return value

    def template_options(self, tools: list[dict] | None) -> dict:
        """encode_chat's keywords for this request's prompt."""
        return {"tools": tools, "add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "template_kwargs": self.chat_template_kwargs}

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: Any, info) -> Any:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def num_logprobs(self) -> int | None:
        """SamplingParams.logprobs for this request: None (off) or the top-k count."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _loc_to_param(loc: tuple) -> str:
    # ("messages", 0, "content", "list[...]", 1, "ImagePart", "image_url") ->
    # "messages[0].content[1].image_url": union-branch tags are not part of the client's path
    out = ""
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif not (item[:1].isupper() or "[" in item or "(" in item or item in _TYPE_TAGS):
            out += ("." if out else "") + item
    return out


def _deepest(errors: list[dict]) -> dict:
    # A union reports one error per branch; the branch that got furthest is the one meant:
    # the deepest, then the one that failed at a later item (["a", 5] is a list of texts
    # with a bad prompt[1], not a list of ids with a bad prompt[0])
    def progress(e: dict) -> tuple:
        loc = tuple(e.get("loc", ()))
        path = _loc_to_param(loc)
        return path.count(".") + path.count("["), len(path), [i for i in loc if isinstance(i, int)]

    return max(errors, key=progress)


MAX_JSON_DEPTH = 32  # a chat request nests 6 deep; deeper bodies are refused, not recursed


def _check_json(value: Any, path: str = "", depth: int = 0) -> None:
    """Depth limit and valid Unicode (JSON allows a lone "\\ud800"; text must not have one)."""
    if depth > MAX_JSON_DEPTH:
        raise APIError(f"request body nests deeper than {MAX_JSON_DEPTH} levels at "
                       f"'{path}'", param=path or None, code="json_too_deep")
    if isinstance(value, str):
        if value.isascii():  # the common case (base64 images too): nothing to check
            return
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(f"'{path}' is not valid Unicode (a lone UTF-16 surrogate); send "
                           "UTF-8 text", param=path or None, code="invalid_unicode") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, path, depth + 1)
            _check_json(item, f"{path}.{key}" if path else key, depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]", depth + 1)


def parse_chat_request(raw: bytes, model: type[BaseModel] = ChatCompletionRequest):
    """Bytes of a POST body -> validated `model` (a chat request unless said otherwise), or
    APIError(400) naming the field."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(f"request body is not valid JSON: {err}", code="invalid_json") from None
    except RecursionError:  # the parser's own guard, far deeper than MAX_JSON_DEPTH
        raise APIError(f"request body nests deeper than {MAX_JSON_DEPTH} levels",
                       code="json_too_deep") from None
    except ValueError as err:  # Python's int-from-string limit: "Exceeds the limit (4300 ..."
        raise APIError(f"request body holds a number too long to read ({err}); send numbers "
                       "of at most 4300 digits", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError("request body must be a JSON object", code="invalid_json")
    _check_json(data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise refusal_of(err) from None


def refusal_of(err: ValidationError) -> APIError:
    """The 400 of a body that does not validate, naming its deepest bad field."""
    first = _deepest(err.errors())
    param = _loc_to_param(tuple(first.get("loc", ())))
    msg = first.get("msg", "invalid value")
    value = first.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        # JSON readers take NaN and Infinity; every range check then fails in a way that
        # misleads ("should be less than or equal to 2" for NaN)
        msg = f"must be a finite number, got {value}"
    if not param:  # a check of the body as a whole: its message names the fields
        return APIError(msg.removeprefix("Value error, "), code="invalid_value")
    return APIError(f"invalid value for '{param}': {msg}", param=param, code="invalid_value")


IMAGE_MARKER = "<image>"  # graft.template's marker; kept literal so this module stays light


def to_chat_messages(messages: list[ChatMessage]) -> tuple[list[dict], list[tuple[str, str]]]:
    """OpenAI messages -> template messages with one `<image>` marker per image part, plus
    (param path, url) per image in prompt order."""
    out: list[dict] = []
    images: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        parts = msg.content if isinstance(msg.content, list) else [msg.content or ""]
        text = []
        for j, part in enumerate(parts):
            where = f"messages[{i}].content" + (f"[{j}]" if isinstance(msg.content, list) else "")
            piece = part if isinstance(part, str) else getattr(part, "text", None)
            if piece is not None:
                if IMAGE_MARKER in piece:
                    raise APIError(f"{where}: text must not contain the literal {IMAGE_MARKER}; "
                                   "send images as image_url parts", param=where,
                                   code="invalid_value")
                text.append(piece)
            else:
                if msg.role != "user":
                    raise APIError(f"{where}: images are only accepted in user messages",
                                   param=where, code="invalid_value")
                images.append((f"{where}.image_url.url", part.image_url.url))
                text.append(IMAGE_MARKER)
        out.append({"role": "system" if msg.role == "developer" else msg.role,
                    "content": "\n".join(text)})  # LLaVA style: "<image>\nquestion"
        thought = msg.reasoning if msg.reasoning is not None else msg.reasoning_content
        if thought is not None and msg.role == "assistant":  # checked with the tools
            out[-1].update(reasoning=thought, reasoning_content=thought)
    return out, images
