"""POST /v1/embeddings, the request: OpenAI's `input` (a text, token ids, or a list of either:
one embedding each) or vLLM's `messages` (one chat, images included where the model is a
graft: the grafted model's embedding of what it sees), with vLLM's extensions
(truncate_prompt_tokens, add_special_tokens, use_activation). The engine pools the prompt's
last hidden states (serving/engine/pooling.py) the way `graft serve --pooling` says."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Union

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.chat_request import EngineRequest, to_engine_request, truncated
from graft.serving.http.openai.completions_request import (no_empty_prompt, one_per_prompt,
                                                           prompt_ids)

Int = P.Int
Prompt = Union[str, list[Int], list[str], list[list[Int]]]
MAX_INPUTS = 2048  # OpenAI's limit of inputs per request


class EmbeddingRequest(P._Strict):
    model: str
    input: Prompt | None = None
    messages: list[P.ChatMessage] | None = Field(default=None, min_length=1)  # vLLM's chat form
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32
    dimensions: Int | None = Field(default=None, ge=1)
    user: str | None = None
    # vLLM's: keep k of the prompt's tokens (-1: the context's length), the first k
    # (truncation_side "right") or the last k ("left"); unset: the tokenizer's side, as vLLM
    truncate_prompt_tokens: Int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    add_special_tokens: bool = True  # for `input` text (BOS and the like)
    use_activation: bool | None = None  # vLLM's: normalize (None: the server's default, yes)
    normalize: bool | None = None  # vLLM's older name for the same
    priority: Int = Field(default=0, ge=-(2 ** 31), le=2 ** 31 - 1)
    ttft_budget_ms: float | None = Field(default=None, gt=0.0)  # graft's: when it must be ready
    # for `messages`: the chat template's controls (vLLM's defaults for embeddings)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    _param: str = PrivateAttr(default="input")  # where this input is in the request
    # what the chat path's submission reads: no prefill/decode split, no image shrinking
    kv_transfer_params: ClassVar[None] = None
    shrink_images_to_budget: ClassVar[bool] = False

    @field_validator("input")
    @classmethod
    def _no_empty_input(cls, value: Any) -> Any:
        return no_empty_prompt(value, "input")

    @model_validator(mode="after")
    def _one_source(self) -> "EmbeddingRequest":
        if (self.input is None) == (self.messages is None):
            raise ValueError("send exactly one of input (texts or token ids) or messages (a chat)")
        if self.messages is not None and self.truncate_prompt_tokens is not None:
            raise ValueError("truncate_prompt_tokens cuts `input`, not a chat's messages; "
                             "leave it out or send the text as input")
        if None not in (self.use_activation, self.normalize) and \
                self.use_activation != self.normalize:
            raise ValueError("use_activation and normalize disagree; send one of them")
        return self

    def normalized(self) -> bool:
        return next((v for v in (self.use_activation, self.normalize) if v is not None), True)

    def input_requests(self) -> list["EmbeddingRequest"]:
        """One request per input of a list (itself for one input or a chat)."""
        if self.messages is not None:
            return [self]
        parts = one_per_prompt(self, "input")
        if len(parts) > MAX_INPUTS:
            raise P.APIError(f"{len(parts)} inputs; one request embeds at most {MAX_INPUTS}",
                             param="input", code="invalid_value")
        return parts

    def output_limit(self) -> None:  # (the chat path's: nothing is generated)
        return None


def to_embedding_request(ctx, req: EmbeddingRequest, front) -> EngineRequest:
    """The EngineRequest of one input's (or the chat's) embedding: its prompt and
    PoolingParams (ServerContext.prepare calls it)."""
    from graft.serving.engine.pooling import PoolingParams

    hidden = ctx.engine.runner.hidden_size
    if req.dimensions is not None and req.dimensions != hidden:
        raise P.APIError(f"dimensions={req.dimensions}: this model's embeddings have {hidden}, "
                         "and it was not trained for shorter (Matryoshka) ones; leave "
                         "dimensions out", param="dimensions", code="invalid_value")
    pool = PoolingParams(ctx.settings.pooling, req.normalized())
    if req.messages is not None:
        try:  # (the chat's own checks: template variables, continue_final_message)
            chat = P.ChatCompletionRequest(
                model=req.model, messages=req.messages,
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                chat_template_kwargs=req.chat_template_kwargs)
        except ValidationError as err:
            raise P.refusal_of(err) from None
        er = to_engine_request(ctx, chat, front)
        er.params = pool
        return er
    ids = prompt_ids(ctx, req.input, req._param, req.add_special_tokens)
    side = req.truncation_side or getattr(ctx.tokenizer, "truncation_side", "right")
    ids = truncated(ctx, ids, req.truncate_prompt_tokens, req._param, side)
    if len(ids) > ctx.max_model_len:
        raise P.APIError(f"{req._param} is {len(ids)} tokens, over the model's context of "
                         f"{ctx.max_model_len} tokens; shorten it or set truncate_prompt_tokens",
                         param=req._param, code="context_length_exceeded")
    return EngineRequest(ids, None, [], pool)
