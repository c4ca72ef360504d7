"""The request fields that shape sampling beyond temperature and top_p: `logit_bias`, the
presence / frequency / repetition penalties, `min_tokens`, `response_format` (OpenAI's names
and ranges; repetition_penalty and min_tokens as vLLM has them), vLLM's `structured_outputs`
(a JSON schema, any JSON object, a regex, a list of choices or a grammar) and llama.cpp's
`grammar`, as a
mixin any request model can take, and how they become SamplingParams fields."""

from __future__ import annotations

import json
import re
from typing import Any, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator,
                      model_validator)
from typing_extensions import Annotated


class _Fields(BaseModel):
    # as openai_chat._Strict: unknown keys ignored, known ones typed without coercion
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class TextFormat(_Fields):
    type: Literal["text"]


class JsonObjectFormat(_Fields):
    type: Literal["json_object"]


class JsonSchema(_Fields):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")  # `schema` is a BaseModel method
    strict: bool | None = None  # the grammar always holds; accepted for the openai client


class JsonSchemaFormat(_Fields):
    type: Literal["json_schema"]
    json_schema: JsonSchema


_FORMATS = {"text": "TextFormat", "json_object": "JsonObjectFormat",
            "json_schema": "JsonSchemaFormat"}


def _format_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return _FORMATS.get(kind) if isinstance(kind, str) else None


# dispatch on "type" so a bad json_schema reports its own field, not every branch's
# (capitalized tags: openai_chat leaves them out of the field path it reports)
ResponseFormat = Annotated[Union[Annotated[TextFormat, Tag("TextFormat")],
                                 Annotated[JsonObjectFormat, Tag("JsonObjectFormat")],
                                 Annotated[JsonSchemaFormat, Tag("JsonSchemaFormat")]],
                           Discriminator(_format_kind)]


class StructuredOutputs(_Fields):
    """vLLM's `structured_outputs`, the kinds graft follows: exactly one of a JSON schema
    (`json`, an object or its JSON text), any JSON object, a regex the whole answer matches,
    strings the answer is one of, or a context-free grammar (Lark or GBNF text)."""
    json_: Union[dict[str, Any], str, None] = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = Field(default=None, min_length=1)
    choice: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, min_length=1)

    @field_validator("json_")
    @classmethod
    def _schema_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as err:
                raise ValueError(f"json is not valid JSON ({err})") from None
            if not isinstance(value, dict):
                raise ValueError("json must be a JSON schema object")
        return value

    @model_validator(mode="after")
    def _one_kind(self):
        given = [name for name, value in (("json", self.json_), ("json_object", self.json_object),
                                          ("regex", self.regex), ("choice", self.choice),
                                          ("grammar", self.grammar))
                 if value is not None]
        if len(given) != 1:
            raise ValueError("set exactly one of json, json_object, regex, choice and grammar, "
                             f"got {', '.join(given) or 'none'}")
        return self

    def sampling_kwargs(self) -> dict[str, Any]:
        return {"guided_json": True if self.json_object else self.json_,
                "guided_regex": self.regex, "guided_choice": self.choice,
                "guided_cfg": self.grammar}


NOT_SERVED = {
    "use_beam_search": "beam search is not implemented here; ask for several samples with n",
    "best_of": "best_of is not implemented here (vLLM's V1 engine dropped it too); ask for n "
               "samples and pick with logprobs",
    "prompt_embeds": "prompt embeddings are not taken; send the prompt as text or token ids",
    "logits_processors": "custom logits processors are not taken; use logit_bias, "
                         "allowed_token_ids, bad_words or a grammar (structured_outputs)",
    # vLLM refuses it too unless started with --trust-request-chat-template
    "chat_template": "a chat template in the request is not taken; start the server with "
                     "--chat-template instead"}


class SamplingKnobs(_Fields):
    # OpenAI: token id (as a JSON key, a string) -> bias added to its logit, -100..100
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)  # vLLM-style extension
    min_tokens: int | None = Field(default=None, ge=0)  # vLLM-style extension
    # vLLM's: sample only among these token ids; never write these words
    allowed_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1)
    bad_words: list[Annotated[str, Field(min_length=1)]] | None = None
    # vLLM's fields this server cannot honour: refused when they ask for something, not
    # ignored (an answer that silently is not what was asked for)
    use_beam_search: bool | None = None
    best_of: int | None = Field(default=None, ge=1)
    prompt_embeds: Any = None
    logits_processors: Any = None
    chat_template: Any = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # vLLM's; not with response_format
    grammar: str | None = Field(default=None, min_length=1)  # llama.cpp's: GBNF (or Lark) text

    @field_validator("use_beam_search", "best_of", "prompt_embeds", "logits_processors",
                     "chat_template")
    @classmethod
    def _not_served(cls, value: Any, info) -> Any:
        if value not in (None, False, [], "") and not (info.field_name == "best_of" and value == 1):
            raise ValueError(NOT_SERVED[info.field_name])
        return value

    @field_validator("response_format", mode="before")
    @classmethod
    def _known_format(cls, value: Any) -> Any:
        if _format_kind(value) is None:
            got = value.get("type") if isinstance(value, dict) else value
            raise ValueError(f"must be an object whose type is 'text', 'json_object' or "
                             f"'json_schema', got {got!r}")
        return value

    @field_validator("min_tokens", mode="before")
    @classmethod
    def _whole_float(cls, value: Any) -> Any:
        # JSON Schema's "integer" includes 8.0 (as openai_chat.Int)
        return int(value) if isinstance(value, float) and value.is_integer() else value

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, value: Any) -> Any:
        for key, bias in (value or {}).items():
            if not (key.isascii() and key.isdigit()) or len(key) > 12:
                raise ValueError(f"keys must be token ids (decimal strings), got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"bias for token {key} must be in [-100, 100], got {bias!r}")
        return value

    @field_validator("structured_outputs", "grammar")
    @classmethod
    def _one_grammar(cls, value: Any, info) -> Any:
        fmt = info.data.get("response_format")
        sent = [name for name, given in (
            ("response_format", fmt is not None and not isinstance(fmt, TextFormat)),
            ("structured_outputs", info.data.get("structured_outputs") is not None))
            if given and name != info.field_name]
        if value is not None and sent:
            raise ValueError(f"a request follows one grammar: send {sent[0]} or "
                             f"{info.field_name}, not both")
        return value

    def or_default(self, name: str, defaults: dict, neutral: Any) -> Any:
        """The request's field `name`; where it is unset, `defaults`' value (the model's,
        sampling_defaults.py), else `neutral`."""
        value = getattr(self, name)
        return defaults.get(name, neutral) if value is None else value

    def sampling_kwargs(self, defaults: dict | None = None) -> dict[str, Any]:
        """These fields as SamplingParams keyword arguments; where absent, `defaults` (the
        model's, sampling_defaults.py), else the neutral values."""
        model = defaults or {}
        fmt = self.response_format
        guided = (fmt.json_schema.schema_ if isinstance(fmt, JsonSchemaFormat)
                  else True if isinstance(fmt, JsonObjectFormat) else None)
        grammar = ({"guided_json": guided, "guided_cfg": self.grammar}
                   if self.structured_outputs is None
                   else self.structured_outputs.sampling_kwargs())
        return dict(
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            presence_penalty=self.or_default("presence_penalty", model, 0.0),
            frequency_penalty=self.or_default("frequency_penalty", model, 0.0),
            repetition_penalty=self.or_default("repetition_penalty", model, 1.0),
            min_tokens=self.min_tokens or 0, allowed_token_ids=self.allowed_token_ids, **grammar)

    def request_fields(self) -> dict[str, str]:
        """SamplingParams field -> the request field the client sent it as."""
        so = "structured_outputs" if self.structured_outputs is not None else None
        return {"guided_json": f"{so}.json" if so else "response_format",
                "guided_regex": "structured_outputs.regex",
                "guided_choice": "structured_outputs.choice",
                "guided_cfg": f"{so}.grammar" if so else "grammar"}


def bad_words_token_ids(tokenizer, words: list[str] | None) -> list[list[int]] | None:
    """vLLM's bad_words as token id sequences: each word as written (its leading spaces
    dropped) and, where the tokenizer spells it differently after a space with as many tokens,
    that spelling too, so a word is kept out at the start of the text and after a space."""
    if not words:
        return None
    out: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        out += [bare] if bare else []
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            out.append(spaced)
    return out or None


def request_param(message: str, fields: dict[str, str] | None = None
                  ) -> tuple[str | None, str]:
    """(request field, message in the client's words) for a SamplingParams error message:
    "SamplingParams.guided_json is not ..." -> ("response_format", "response_format is not ...")
    (`fields`: SamplingKnobs.request_fields, where the request is at hand)."""
    found = re.match(r"SamplingParams\.(\w+)", message)
    if found is None:
        return None, message
    field = (fields or {"guided_json": "response_format"}).get(found.group(1), found.group(1))
    return field, field + message[found.end():]
