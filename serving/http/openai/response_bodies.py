"""The bodies of OpenAI chat and text completion answers: the JSON answer, the SSE chunks,
usage (with graft's cached, transferred and speculated token counts) and logprobs."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int, out=None) -> dict[str, Any]:
    """OpenAI usage: prompt_tokens_details.cached_tokens counts the prompt tokens whose KV
    the engine did not compute for this request (prefix cache, or another engine's KV: the
    sequence's num_cached_tokens); `transferred_tokens` (graft) those of them whose KV came
    from a prefill worker, which vllm-router keeps where it replaces cached_tokens with the
    prefill worker's. A request that speculated also reports its proposals the way OpenAI's
    predicted outputs do (completion_tokens_details.*_prediction_tokens)."""
    details = {"cached_tokens": out.num_cached_tokens if out is not None else 0}
    if out is not None and out.num_transferred_tokens:
        details["transferred_tokens"] = out.num_transferred_tokens
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens,
                            "prompt_tokens_details": details}
    if out is not None and out.spec_verify_steps:
        accepted = out.spec_accepted_tokens
        body["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": out.spec_proposed_tokens - accepted,
            # graft: tokens emitted per verify step (accepted + the step's own token)
            "mean_accepted_length": round((accepted + out.spec_verify_steps)
                                          / out.spec_verify_steps, 3)}
    return body


def token_id_text(token_id: int) -> str:
    """vLLM's return_tokens_as_token_ids spelling of a token: `token_id:N`, for tokens whose
    text alone does not say which token it was (byte pieces, merges)."""
    return f"token_id:{token_id}"


def logprobs_body(token_ids: list[int], entries: list[dict[int, float]], top: int,
                  decode) -> dict[str, Any]:
    """OpenAI `choices[].logprobs`: per output token its text, logprob, UTF-8 bytes and the
    `top` most likely alternatives. entries[i] holds the sampled token and the top-k."""
    def item(tid: int, lp: float) -> dict[str, Any]:
        text = decode(tid)
        return {"token": text, "logprob": lp, "bytes": list(text.encode())}

    content = []
    for tid, entry in zip(token_ids, entries):
        best = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
        content.append({**item(tid, entry[tid]), "top_logprobs": [item(t, lp) for t, lp in best]})
    return {"content": content, "refusal": None}


def prompt_logprobs_body(out, decode) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs`: per prompt token None (the first; an image position) or
    {token id: {logprob, rank, decoded_token}} of the prompt's own token and the k likeliest
    (their ranks 1..k; the prompt token's own rank among the whole vocabulary)."""
    if out is None or out.prompt_logprobs is None:
        return None
    body: list[dict[str, Any] | None] = []
    for tid, entry, rank in zip(out.prompt_token_ids, out.prompt_logprobs, out.prompt_ranks):
        ordered = sorted(entry.items(), key=lambda kv: -kv[1]) if entry is not None else None
        body.append(None if ordered is None else {
            str(t): {"logprob": lp, "rank": rank if t == tid else r, "decoded_token": decode(t)}
            for r, (t, lp) in enumerate(ordered, 1)})
    return body


def completion_body(cid: str, model: str, text: str, finish_reason: str | None,
                    prompt_tokens: int, completion_tokens: int,
                    logprobs: dict[str, Any] | None = None, out=None) -> dict[str, Any]:
    return {
        "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": logprobs, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens, out),
    }


def chunk_body(cid: str, model: str, delta: dict[str, Any], finish_reason: str | None,
               created: int, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                         "finish_reason": finish_reason}]}


def usage_chunk_body(cid: str, model: str, created: int, prompt_tokens: int,
                     completion_tokens: int, out=None) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage(prompt_tokens, completion_tokens, out)}


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
