"""What a request the engine finished with an error is told instead of its answer: an
OpenAI error body, a 400 naming the request field its settings broke, or a 500 that names no
internals. The engine core only says why (finish_reason and error); status codes are here."""

from __future__ import annotations

from graft.serving.engine.grammar_check import FIELD as GUIDED_FIELD, GrammarLimitError
from graft.serving.engine.logits_processors import NO_TOKEN_LEFT
from graft.serving.http.openai.openai_chat import APIError
from graft.serving.http.openai.tool_plan import guided_by_tools, refusal


def internal_error() -> APIError:
    # The details go to the server log, never to a client (they may name internals).
    return APIError("the server failed while generating this response; the server log has "
                    "the details", status=500, type="server_error", code="engine_error")


def finish_error(job, out) -> APIError | None:
    """The error `job` is answered with for its finished output `out`; None: `out` is its
    answer (finish_reason "error" after some tokens of its own text stays an answer)."""
    if out.finish_reason == "internal_error":  # logged by the engine
        return internal_error()
    error = out.error or ""
    if out.finish_reason != "error":
        return None
    if error.startswith(GUIDED_FIELD):  # its grammar met llguidance's row limit mid-generation
        return refusal(GrammarLimitError(error, "max_items_in_row"), guided_by_tools(job.request),
                       job.request)
    if error.startswith(NO_TOKEN_LEFT):
        return APIError(error, param="allowed_token_ids", code="invalid_value")
    if not out.token_ids:  # the engine refused the prompt
        return APIError(error or "the engine rejected this prompt", param=job.prompt_param(),
                        code="invalid_prompt")
    return None
