"""Workers of a fleet share image embeddings: a worker asks its peers before it encodes, so an
image one worker encoded is not encoded again by another (routers cannot keep an image on one
worker); a peer that is down or lacks the image only means encoding here."""

import argparse

import httpx
import pytest
from PIL import Image

from graft.serving.multimodal.media import to_data_url
from tests.serving.http.conftest import LiveServer

IMAGE = Image.new("RGB", (32, 32), (200, 120, 10))
OTHER = Image.new("RGB", (32, 32), (10, 120, 200))


def _worker(run_dir, peers=()):
    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    argv = [str(run_dir), "--served-model-name", "tiny", "--max-model-len", "256",
            "--num-kv-blocks", "64"]
    if peers:
        argv += ["--encoder-cache-peers", *peers]
    return LiveServer(serve_cli.build(parser.parse_args(argv)))


def _ask(server, image):
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": to_data_url(image)}},
                {"type": "text", "text": "What is this?"}]}]}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _fetches(server) -> float:
    text = httpx.get(server.url + "/metrics").text
    line = next(x for x in text.splitlines()
                if x.startswith("graft_encoder_cache_peer_fetches_total"))
    return float(line.split()[-1])


@pytest.fixture(scope="module")
def fleet(tiny_run_dir):
    with _worker(tiny_run_dir) as a:
        down = "http://127.0.0.1:9"  # nothing listens there
        with _worker(tiny_run_dir, (down, a.url)) as b:
            yield a, b


def test_an_image_another_worker_encoded_is_taken_not_encoded(fleet):
    a, b = fleet
    first = _ask(a, IMAGE)
    front_b = b.app.state.ctx.front
    encodes = front_b.encode_calls
    assert _ask(b, IMAGE) == first  # the same embeddings, the same answer
    assert front_b.encode_calls == encodes
    assert _fetches(b) == 1


def test_an_image_no_peer_holds_is_encoded_here(fleet):
    _, b = fleet
    front_b = b.app.state.ctx.front
    encodes, fetched = front_b.encode_calls, _fetches(b)
    _ask(b, OTHER)
    assert front_b.encode_calls == encodes + 1 and _fetches(b) == fetched


def test_the_peer_endpoint_says_what_it_does_not_hold(fleet):
    a, _ = fleet
    r = httpx.get(a.url + "/v1/graft/encoder_cache/" + "0" * 64)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_cached"
