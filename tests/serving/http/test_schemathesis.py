"""Schemathesis over the server's real /openapi.json, on loopback: a bounded run for every
operation the schema lists, with bodies that fit the schema (positive) and bodies that break
it (negative). Every answer must be no 5xx, with a status, content type, headers and body the
schema declares, and every schema-breaking body must be refused.

Left out: schemathesis's check that every schema-valid body is accepted. The server also
refuses what JSON Schema cannot say (an image part outside a user message, a URL that is no
image, a prompt over the context, a lone surrogate in a string); those refusals are 400s the
adversarial tests pin down, and here the positive run must still get real 200s.

(Strategies through `@given`, not `schema.parametrize()`: the latter's lazy fixture loader
renames pytest nodes through a private attribute pytest 9 no longer has.)"""

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

MAX_EXAMPLES = 25  # per operation and mode: seconds on the tiny model


@pytest.fixture(scope="module")
def operations(live_server):
    schema = schemathesis.openapi.from_url(live_server.url + "/openapi.json")
    schema.config.update(base_url=live_server.url)
    schema.config.output.sanitization.update(enabled=False)  # "*token*" fields are no secrets
    ops = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in ops} >= {"/v1/chat/completions", "/v1/models", "/health"}
    return ops


def _served(case, mode):
    """Valid bodies name the served model (a random name is only ever a 404) and ask for
    few tokens (generation stays short); none of the changes below makes a body invalid."""
    body = case.body
    if not isinstance(body, dict) or mode is not GenerationMode.POSITIVE:
        return
    body["model"] = "tiny"
    for field in ("max_tokens", "max_completion_tokens"):  # (the schema cannot say "fits
        if isinstance(body.get(field), (int, float)) and body[field] > 8:  # the context")
            body[field] = 8
    # nor that a tool message answers the assistant's tool call before it: most generated
    # chats would be that 400, leaving too few to generate; a TTFT budget makes admission
    # depend on this machine's speed at the moment
    body.pop("ttft_budget_ms", None)
    if isinstance(body.get("messages"), list):
        kept = [m for m in body["messages"]
                if not (isinstance(m, dict) and (m.get("role") == "tool" or "tool_calls" in m))]
        body["messages"] = kept or [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_schema_holds(operations, live_server, mode):
    statuses: dict[str, set[int]] = {}
    for op in operations:
        if mode is GenerationMode.NEGATIVE and not (op.body or any(op.iter_parameters())):
            continue  # nothing in a bare GET can break the schema
        @hypothesis.given(case=op.as_strategy(generation_mode=mode))
        @hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
                             derandomize=True, phases=[hypothesis.Phase.generate],
                             suppress_health_check=list(hypothesis.HealthCheck))
        def check(case):
            _served(case, mode)
            response = case.call_and_validate(timeout=60,
                                              excluded_checks=[positive_data_acceptance])
            statuses.setdefault(op.path, set()).add(response.status_code)

        check()
    chat = statuses["/v1/chat/completions"]
    if mode is GenerationMode.POSITIVE:
        assert 200 in chat, statuses  # valid bodies really generate
    else:
        assert chat and all(400 <= s < 500 for s in chat), statuses
    assert live_server.app.state.ctx.worker._thread.is_alive()
