"""One request on its way through the engine worker: what the HTTP layer hands it (prompt,
sampling, images, deadline, where its outputs go) and what the worker learns of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from graft.serving.http.plumbing.admission import QueueItem


@dataclass
class Job:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: object  # SamplingParams
    sink: Callable[[str, object], None]  # thread-safe; kinds: output, error, deadline
    prepared: object = None  # multimodal.PreparedPrompt when the prompt has images
    deadline: float | None = None  # absolute time.monotonic() for the first token
    priority: int = 0  # the request's (vLLM's): lower waits less, after deadlines
    arrival: float = field(default_factory=time.monotonic)
    encode_tokens: int = 0  # image tokens not in the encoder cache at admission
    front: object = None  # MultimodalFront of the graft it asked for (None: text only)
    graft: str | None = None  # served model name, for per-graft metrics
    estimate_s: float | None = None  # admission control's TTFT estimate
    first_token_at: float | None = None
    last_output_at: float | None = None  # when its output last grew (inter-token latency)
    n_output: int = 0
    failed: bool = False  # failed before entering the engine (error already sent)
    request: object = None  # the parsed ChatCompletionRequest (for --trace)
    kv_export: bool = False  # P/D prefill half: hold the prompt's KV for a decode worker
    kv_import: object = None  # P/D decode half: kv_transfer.KVPayload or NixlSource

    def queue_item(self) -> QueueItem:
        return QueueItem(self.deadline if self.deadline is not None else float("inf"),
                         len(self.prompt_token_ids), self.encode_tokens)

    def prompt_param(self) -> str:
        """Where the prompt is in its request: `prompt` (or `prompt[i]`) of a completion,
        `input` of embeddings and of the Responses API, a chat's `messages`."""
        param = getattr(self.request, "_param", None)
        if param is None and type(self.request).__name__ == "ResponsesChat":
            return "input"
        return param or "messages"

    def images_to_encode(self) -> list:
        """The images whose embeddings this job's prefill needs: not those whose positions all
        came with KV from a prefill worker (they are encoded on demand if a preemption drops
        that KV; MultimodalFront.mm_inputs)."""
        if self.kv_import is None:
            return self.prepared.images
        from graft.serving.engine.kv_transfer import importable_tokens

        spans = list(zip(self.prepared.images, self.prepared.spans))
        n = importable_tokens(self.prompt_token_ids,
                              [(im.key, off, length) for im, (off, length) in spans],
                              self.kv_import)
        return [im for im, (off, length) in spans if off + length > n]
