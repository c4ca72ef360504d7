"""POST /reset_prefix_cache (vLLM's): the next identical chat hits no cached block."""

import httpx


def _cached(server, body) -> int:
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_reset_forgets_the_prefix_cache(plain_server):
    body = {"model": "plain", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "user", "content": "Cache me, please. " * 20}]}
    _cached(plain_server, body)
    assert _cached(plain_server, body) > 0
    # a JSON body (any): the server refuses POSTs a web page could send unasked (415)
    r = httpx.post(plain_server.url + "/reset_prefix_cache", json={})
    assert r.status_code == 200 and r.json() == {"reset": True}
    assert _cached(plain_server, body) == 0
