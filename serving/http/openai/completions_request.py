"""POST /v1/completions (OpenAI's legacy text completions): a prompt string or token ids, no
chat template, text only. It shares the chat path's reading, SamplingParams, submission and
streaming (chat_request.py, responses.py); what differs is the request (below) and the answer
(completions_answer.py)."""

from __future__ import annotations

from functools import partial
from typing import Any, Union

from pydantic import Field, field_validator

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.chat_request import (EngineRequest, check_room, check_text_length,
                                               sampling_params_for)

Int = P.Int
Prompt = Union[str, list[Int], list[str], list[list[Int]]]


class CompletionRequest(P.SamplingFields):
    # one prompt: a string or token ids, or a list holding one of those (the openai client
    # accepts lists of prompts; graft serves one per request, like n=1)
    prompt: Prompt
    max_tokens: Int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: Int | None = Field(default=None, ge=0, le=20)  # top-k alternatives per token
    echo: bool = False  # the prompt text before the completion
    suffix: str | None = None  # (insertion: not supported)

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and value and isinstance(value[0], (str, list)):
            if len(value) != 1:
                raise ValueError(f"{len(value)} prompts given; this server completes one "
                                 "prompt per request, send them as separate requests")
            value = value[0]
        if not value:
            raise ValueError("the prompt is empty; send text or at least one token id")
        return value

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


def prompt_ids(ctx, req: CompletionRequest) -> list[int]:
    """The prompt's token ids. Text is tokenized as the model's tokenizer does by default
    (special-token text included: the client writes the whole prompt, template and all)."""
    if isinstance(req.prompt, str):
        check_text_length(ctx, len(req.prompt), "prompt")  # megabytes refused untokenized
        return ctx.tokenizer(req.prompt, add_special_tokens=True)["input_ids"]
    vocab = ctx.engine.runner.vocab_size
    for i, tid in enumerate(req.prompt):
        if not 0 <= tid < vocab:
            raise P.APIError(f"prompt[{i}] = {tid} is not a token id of this model (0 to "
                             f"{vocab - 1})", param=f"prompt[{i}]", code="invalid_value")
    return list(req.prompt)


def to_completion_request(ctx, req: CompletionRequest) -> EngineRequest:
    """The EngineRequest of a text completion (ServerContext.prepare calls it)."""
    ids = prompt_ids(ctx, req)
    check_room(ctx, len(ids), req.output_limit(), "prompt")
    return EngineRequest(ids, None, [], sampling_params_for(ctx, req, len(ids)))
