"""POST /v1/completions (OpenAI's legacy text completions): a prompt string or token ids, no
chat template, text only. It shares the chat path's reading, SamplingParams, submission and
streaming (chat_request.py, responses.py); what differs is the request (below) and the answer
(completions_answer.py)."""

from __future__ import annotations

from functools import partial
from typing import Any, Union

from pydantic import Field, PrivateAttr, field_validator

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.chat_request import (EngineRequest, check_room, check_text_length,
                                               sampling_params_for, truncated)

Int = P.Int
Prompt = Union[str, list[Int], list[str], list[list[Int]]]


def no_empty_prompt(value: Any, name: str) -> Any:
    """`value` (a Prompt) if none of its prompts is empty, else ValueError naming it."""
    several = isinstance(value, list) and value and isinstance(value[0], (str, list))
    for i, item in enumerate(value if several else [value]):
        if not item:
            where = f"{name}[{i}] is empty" if several else f"the {name} is empty"
            raise ValueError(f"{where}; send text or at least one token id")
    return value


def one_per_prompt(req, field: str) -> list:
    """req once per prompt of its list `field` (itself when it holds one prompt), each
    copy's `_param` naming where its prompt was."""
    value = getattr(req, field)
    if not (isinstance(value, list) and isinstance(value[0], (str, list))):
        return [req]
    if len(value) == 1:
        return [req.model_copy(update={field: value[0]})]
    parts = []
    for i, item in enumerate(value):
        part = req.model_copy(update={field: item})
        part._param = f"{field}[{i}]"
        parts.append(part)
    return parts


class CompletionRequest(P.SamplingFields):
    # a string or token ids, or a list of those: one choice per prompt (and per n)
    prompt: Prompt
    max_tokens: Int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: Int | None = Field(default=None, ge=0, le=20)  # top-k alternatives per token
    echo: bool = False  # the prompt text before the completion
    suffix: str | None = None  # (insertion: not supported)
    _param: str = PrivateAttr(default="prompt")  # where this prompt is in the request

    @field_validator("prompt")
    @classmethod
    def _no_empty_prompt(cls, value: Any) -> Any:
        return no_empty_prompt(value, "prompt")

    def prompt_requests(self) -> list[CompletionRequest]:
        """One request per prompt of a list (itself when it holds one prompt)."""
        return one_per_prompt(self, "prompt")

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("suffix (insertion) is not supported; leave it out")
        return value

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def num_prompt_logprobs(self) -> int | None:
        """echo with logprobs scores the prompt too (OpenAI's legacy use: a text's likelihood)"""
        wanted = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None)
                  if k is not None]
        return max(wanted) if wanted else None

    def output_limit(self) -> int | None:
        return self.max_tokens


parse_completion_request = partial(P.parse_chat_request, model=CompletionRequest)


def prompt_ids(ctx, prompt: str | list[int], where: str, add_special_tokens: bool = True
               ) -> list[int]:
    """The token ids of one prompt (text or ids) found at `where` in the request. Text is
    tokenized as the model's tokenizer does by default (special-token text included: the
    client writes the whole prompt, template and all); ids must be the model's."""
    if isinstance(prompt, str):
        check_text_length(ctx, len(prompt), where)  # megabytes refused untokenized
        return ctx.tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
    vocab = ctx.engine.runner.vocab_size
    for i, tid in enumerate(prompt):
        if not 0 <= tid < vocab:
            raise P.APIError(f"{where}[{i}] = {tid} is not a token id of this model (0 to "
                             f"{vocab - 1})", param=f"{where}[{i}]", code="invalid_value")
    return list(prompt)


def to_completion_request(ctx, req: CompletionRequest) -> EngineRequest:
    """The EngineRequest of a text completion of one prompt (ServerContext.prepare calls it)."""
    ids = truncated(ctx, prompt_ids(ctx, req.prompt, req._param), req.truncate_prompt_tokens,
                    req._param)
    check_room(ctx, len(ids), req.output_limit(), req._param)
    return EngineRequest(ids, None, [], sampling_params_for(ctx, req, len(ids)))
