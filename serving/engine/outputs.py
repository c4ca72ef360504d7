"""What the engine hands back per request, and incremental detokenization with stop strings."""

from __future__ import annotations

from dataclasses import dataclass, field

from graft.serving.engine.sequence import Sequence

_CONTEXT_TOKENS = 5  # prompt tokens decoded as context so the first word keeps its spacing


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # every output token so far
    text: str  # every output character so far (cut before a stop string)
    new_token_ids: list[int] = field(default_factory=list)  # since the previous step()
    new_text: str = ""  # since the previous step()
    finished: bool = False
    finish_reason: str | None = None  # stop | length | deadline | error | abort | internal_error
    stop_reason: int | str | None = None  # vLLM's: the stop token id or string that ended it
    error: str | None = None  # what went wrong, for finish_reason "error" / "internal_error"
    logprobs: list[dict[int, float]] | None = None  # per output token: {token id: logprob}
    # per prompt token (the first None), once the prompt is computed; SamplingParams.prompt_logprobs
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_ranks: list[int | None] | None = None  # ... and each prompt token's rank (1: likeliest)
    embedding: list[float] | None = None  # a pooling request's (pooling.py), when finished
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (or transferred)
    num_transferred_tokens: int = 0  # ... of them, those whose KV came from another engine
    spec_proposed_tokens: int = 0  # speculative decoding: tokens proposed for this request ...
    spec_accepted_tokens: int = 0  # ... and accepted
    spec_verify_steps: int = 0  # steps that verified proposals
    arrival_time: float = 0.0  # time.monotonic() seconds
    first_token_time: float | None = None
    finish_time: float | None = None


class Detokenizer:
    """Appends the text of new tokens to seq.text without re-decoding the whole output."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def append(self, seq: Sequence) -> None:
        if self.tokenizer is None:
            return
        if seq.detok_state is None:
            context = [t for t in seq.token_ids[:seq.num_prompt_tokens] if t >= 0][-_CONTEXT_TOKENS:]
            # (context ids, prefix_offset, read_offset) over context + output ids: the text of
            # ids[prefix:read] is already in seq.text (or is context)
            seq.detok_state = (context, 0, len(context))
        context, prefix, read = seq.detok_state
        ids = context + seq.output_token_ids
        skip = seq.params.skip_special_tokens
        prefix_text = self.tokenizer.decode(ids[prefix:read], skip_special_tokens=skip)
        full_text = self.tokenizer.decode(ids[prefix:], skip_special_tokens=skip)
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            seq.text += full_text[len(prefix_text):]
            prefix, read = read, len(ids)
        seq.detok_state = (context, prefix, read)


def find_stop_string(seq: Sequence, old_len: int) -> tuple[int, str] | None:
    """(where seq.text ends, the stop string) at the first stop string in the text added
    since old_len: it ends where the string starts, or where it ends with
    params.include_stop_str_in_output; None if there is none."""
    best = None
    for stop in seq.params.stop:
        idx = seq.text.find(stop, max(0, old_len - len(stop) + 1))
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, stop)
    if best is None:
        return None
    idx, stop = best
    return idx + (len(stop) if seq.params.include_stop_str_in_output else 0), stop


def make_output(seq: Sequence, final: bool) -> RequestOutput:
    """Output since the last report; text near a possible stop string is held back."""
    tokens = seq.output_token_ids
    text = seq.text
    visible = len(text)
    if not final and seq.params.stop:
        visible = max(seq.sent_text, len(text) - (max(map(len, seq.params.stop)) - 1))
    out = RequestOutput(
        request_id=seq.request_id,
        prompt_token_ids=seq.token_ids[:seq.num_prompt_tokens],
        token_ids=list(tokens),
        text=text[:visible],
        new_token_ids=tokens[seq.sent_tokens:],
        new_text=text[seq.sent_text:visible],
        finished=final,
        finish_reason=seq.finish_reason,
        stop_reason=seq.stop_reason,
        error=seq.error,
        logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
        prompt_logprobs=seq.prompt_logprobs if seq.num_output_tokens else None,
        prompt_ranks=seq.prompt_ranks if seq.num_output_tokens else None,
        embedding=seq.embedding,
        num_cached_tokens=seq.num_cached_tokens,
        num_transferred_tokens=seq.num_transferred_tokens,
        spec_proposed_tokens=seq.spec.proposed if seq.spec else 0,
        spec_accepted_tokens=seq.spec.accepted if seq.spec else 0,
        spec_verify_steps=seq.spec.steps if seq.spec else 0,
        arrival_time=seq.arrival_time,
        first_token_time=seq.first_token_time,
        finish_time=seq.finish_time,
    )
    seq.sent_tokens, seq.sent_text = len(tokens), visible
    return out
