"""Hand-made adversarial requests (found by trying the server as an attacker and as a careless
client would): each gets a clear 4xx with an OpenAI-style error body, never a 500, and the
server keeps serving."""

import httpx
import pytest

URL = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


def _post(server, body, **kw):
    return httpx.post(server.url + URL, json=body, timeout=60, **kw)


def _error(resp, status, param=None):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


TYPED = {  # field -> values the OpenAI API refuses for it
    "max_tokens": [True, "10", 1.5, 0],
    "seed": [2 ** 64, -(2 ** 63) - 1, True, "1"],
    "temperature": ["0.5", True, 2.5],
    "top_p": [0, "1"],
    "logprobs": ["true", 1],
    "stream": ["false", 0],
    "n": [True],
    "stop": [[1, 2], ["a"] * 5],
}


@pytest.mark.parametrize("field,value", [(f, v) for f, vs in TYPED.items() for v in vs])
def test_types_are_strict(live_server, field, value):
    err = _error(_post(live_server, {"model": "tiny", "messages": HELLO, field: value}), 400)
    assert err["param"].startswith(field), err  # "stop" or "stop[0]"


def test_seed_at_the_edges_of_the_sampler_range(live_server):
    for seed in (2 ** 64 - 1, -(2 ** 63)):
        resp = _post(live_server, {"model": "tiny", "messages": HELLO, "seed": seed,
                                   "max_tokens": 2, "temperature": 1.0})
        assert resp.status_code == 200, resp.text


def test_tiny_temperature_is_greedy(live_server):
    body = {"model": "tiny", "messages": HELLO, "max_tokens": 6, "ignore_eos": True}
    greedy = _post(live_server, {**body, "temperature": 0}).json()
    tiny = _post(live_server, {**body, "temperature": 1e-300}).json()
    assert tiny["choices"][0]["message"] == greedy["choices"][0]["message"]
    assert tiny["usage"]["completion_tokens"] == 6
