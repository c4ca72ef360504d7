"""vLLM's scoring API with an embedding model (serving/http/openai/scores.py) against the real
server: /v1/rerank orders documents by the cosine of their /v1/embeddings vectors with the
query's, /v1/score scores pairs the same way; aliases answer alike; refusals name the text."""

import httpx
import numpy as np
import pytest

from tests.serving.http.conftest import settled

QUERY = "Which animal is quick?"
DOCS = ["The quick brown fox jumps.", "Tax forms are due in April.", "A fast red fox runs."]


def post(server, path, body):
    return httpx.post(server.url + path, json={"model": "plain", **body}, timeout=60)


def vectors(server, texts):
    body = post(server, "/v1/embeddings", {"input": texts, "encoding_format": "float"}).json()
    return np.array([d["embedding"] for d in body["data"]]), body["usage"]["prompt_tokens"]


def test_rerank_orders_documents_by_cosine(plain_server):
    vecs, tokens = vectors(plain_server, [QUERY, *DOCS])
    want = vecs[1:] @ vecs[0]
    reply = post(plain_server, "/v1/rerank", {"query": QUERY, "documents": DOCS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [r["index"] for r in body["results"]] == list(np.argsort(-want))
    for r in body["results"]:
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-5)
        assert r["document"] == {"text": DOCS[r["index"]]}
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    top = post(plain_server, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2,
                                         "return_documents": False}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in body["results"][:2]]
    assert all(r["document"] is None for r in top["results"])
    cohere = post(plain_server, "/v2/rerank", {"query": QUERY, "documents": DOCS}).json()
    assert [r["index"] for r in cohere["results"]] == [r["index"] for r in body["results"]]


def test_rerank_in_sglangs_protocol(plain_server):
    """A body with SGLang's `rid` (what sglang-router and vllm-router send a worker) gets
    SGLang's answer: a bare list, the best first; vllm-router's model "default" is the one
    model served."""
    vecs, _ = vectors(plain_server, [QUERY, *DOCS])
    want = vecs[1:] @ vecs[0]
    reply = httpx.post(plain_server.url + "/v1/rerank", timeout=60, json={
        "query": QUERY, "documents": DOCS, "model": "default", "top_k": 2,
        "return_documents": True, "rid": None, "user": None})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [r["index"] for r in body] == list(np.argsort(-want))[:2]
    for r in body:
        assert r["score"] == pytest.approx(want[r["index"]], abs=1e-5)
        assert r["document"] == DOCS[r["index"]] and r["meta_info"]["prompt_tokens"] > 0
    other = post(plain_server, "/v1/rerank", {"query": QUERY, "documents": DOCS,
                                              "model": "default"})
    assert other.status_code == 404  # without SGLang's mark, a model not served is a 404


@pytest.mark.parametrize("names", [("text_1", "text_2"), ("queries", "documents")])
def test_score_pairs_and_broadcasts(plain_server, names):
    vecs, _ = vectors(plain_server, [QUERY, *DOCS])
    one, two = names
    reply = post(plain_server, "/v1/score", {one: QUERY, two: DOCS})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["object"] == "list"
    assert [d["score"] for d in body["data"]] == pytest.approx(list(vecs[1:] @ vecs[0]), abs=1e-5)
    pairs = post(plain_server, "/score", {one: DOCS[:2], two: [QUERY, DOCS[2]]}).json()
    want = [vecs[1] @ vecs[0], vecs[2] @ vecs[3]]
    assert [d["score"] for d in pairs["data"]] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents[1]"),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
    ("/v1/rerank", {"query": QUERY, "documents": ["word " * 3000]}, "documents[0]"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "top_n": -1}, "top_n"),
    ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, None),
    ("/v1/score", {"text_1": "a", "documents": ["b"]}, None),
    ("/v1/score", {"text_1": "a"}, None),
    ("/v1/score", {"text_1": [], "text_2": ["b"]}, None),
    ("/v1/score", {"text_1": "a", "text_2": ["b", ""]}, "text_2[1]"),
    ("/v1/score", {"text_1": "a", "text_2": "b", "model": "nope"}, "model"),
])
def test_bad_requests_are_one_line_4xx(plain_server, path, body, param):
    used = settled(plain_server)
    reply = post(plain_server, path, body)
    assert reply.status_code in (400, 404), reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    assert settled(plain_server) == used
    assert post(plain_server, path.replace("rerank", "score"),
                {"text_1": "a", "text_2": "b"}).status_code == 200
