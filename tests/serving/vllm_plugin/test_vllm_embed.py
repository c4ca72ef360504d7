"""`vllm serve --runner pooling --convert embed` on an exported graft embeds a chat as
`graft serve` embeds it: the same prompt tokens and the same vector (the server is started
once for the module). With images the two processes' vectors are not bit-close: vLLM's venv
has its own transformers (5.19 against graft's 5.24 when this was written), whose SigLIP
image processor rounds some pixels one level apart (1/127.5 after normalization), and graft's
image path, the same code in both, sees those pixels."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from graft.serving.multimodal.media import to_data_url
from tests.serving.vllm_plugin.conftest import image, serve_command, vllm_env


@pytest.fixture(scope="module")
def servers(vllm_python, vllm_export, tmp_path_factory):
    from graft.benchmarks.peers_serve import free_port
    from graft.benchmarks.peers_serve import server as started
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app
    from tests.serving.http.conftest import LiveServer

    run, export = vllm_export("llama", "siglip")
    port = free_port()
    log = tmp_path_factory.mktemp("vllm_embed") / "serve.log"
    cmd = serve_command(vllm_python, export, port, "--runner", "pooling", "--convert", "embed")
    graft = LiveServer(build_app(Engine.from_pretrained(run, EngineConfig(max_model_len=512)),
                                 ServerSettings(model_name="graft")))
    with started(cmd, vllm_env(), port, log, "vllm serve") as url, graft:
        yield url, graft.url


def _embed(url: str, body: dict) -> dict:
    reply = httpx.post(url + "/v1/embeddings", json={"model": "graft", "encoding_format": "float",
                                                     **body}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [[], [(50, 40)], [(23, 37), (64, 64)]])
def test_vllm_embeds_a_graft_chat_as_graft_serve_does(servers, sizes):
    vllm_url, graft_url = servers
    content = [{"type": "image_url", "image_url": {"url": to_data_url(image(60 + i, s))}}
               for i, s in enumerate(sizes)] + [{"type": "text", "text": "What is shown?"}]
    body = {"messages": [{"role": "user", "content": content}]}
    got, want = _embed(vllm_url, body), _embed(graft_url, body)
    assert got["usage"]["prompt_tokens"] == want["usage"]["prompt_tokens"]
    a, b = np.array(got["data"][0]["embedding"]), np.array(want["data"][0]["embedding"])
    if not sizes:
        assert np.abs(a - b).max() < 1e-6, np.abs(a - b).max()
    else:
        assert a @ b > 0.9999 and np.abs(a - b).max() < 2e-3, (a @ b, np.abs(a - b).max())
