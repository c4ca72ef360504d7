"""Speculation through the server: same text as the plain engine, per-request usage details,
the per-request override, and the acceptance series on /metrics."""

import httpx
import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.template import encode_chat
from tests.serving.http.conftest import LiveServer

CHAT = [{"role": "user", "content": "repeat after me: the cat sat on the mat, the cat sat"}]


@pytest.fixture(scope="module")
def spec_server(tiny_llama):
    from graft.serving.http.server import ServerSettings, build_app

    plain = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32))
    ids = encode_chat(plain.tokenizer, CHAT, [], add_generation_prompt=True).input_ids
    (expected,) = plain.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=24, ignore_eos=True))
    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32,
                                                             speculative="ngram"))
    with LiveServer(build_app(engine, ServerSettings(model_name="plain"))) as server:
        server.expected = expected.text
        yield server


def _chat(server, **extra):
    body = {"model": "plain", "messages": CHAT, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True, **extra}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def test_speculating_server_is_lossless_and_reports_acceptance(spec_server):
    resp = _chat(spec_server)
    assert resp.status_code == 200
    out = resp.json()
    assert out["choices"][0]["message"]["content"] == spec_server.expected
    details = out["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0 and details["mean_accepted_length"] > 1
    off = _chat(spec_server, speculative="off").json()
    assert off["choices"][0]["message"]["content"] == spec_server.expected
    assert "completion_tokens_details" not in off["usage"]
    assert _chat(spec_server, speculative="draft-model").status_code == 400
    metrics = httpx.get(spec_server.url + "/metrics", timeout=60).text
    rate = next(line for line in metrics.splitlines()
                if line.startswith("graft_spec_decode_acceptance_rate "))
    assert 0 < float(rate.split()[1]) <= 1
    assert "graft_spec_decode_mean_accepted_length " in metrics
