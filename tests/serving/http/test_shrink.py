"""Native-resolution images (MoonViT) shrink to meet a TTFT budget instead of a 429."""

import httpx
import numpy as np
import pytest
from PIL import Image

from graft.serving.multimodal.media import to_data_url
from tests.run_dirs import write_run_dir
from tests.serving.http.conftest import LiveServer

BIG = Image.fromarray(np.random.default_rng(0).integers(0, 256, (112, 140, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def moonvit_server(k25_dir, tiny_llama, tmp_path_factory):  # noqa: F811
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app

    run = write_run_dir(tmp_path_factory.mktemp("moonvit_run"), tiny_llama,
                        {"kind": "moonvit", "path": str(k25_dir), "feature_layer": -1},
                        {"kind": "mlp", "depth": 2, "layer_norm": True, "norm_chunks": 4})
    engine = Engine.from_pretrained(run, EngineConfig(num_kv_blocks=64, max_model_len=256))
    with LiveServer(build_app(engine, ServerSettings(model_name="kimi"))) as server:
        yield server


def test_shrink_images_to_budget(moonvit_server):
    ctx = moonvit_server.app.state.ctx
    front = ctx.front
    full = front.image_path.image_token_count(*BIG.size)
    assert front.image_path.image_token_count(56, 56) < full  # native resolution: size sets tokens
    # Deterministic costs: 10 ms per prompt token, free encoding; the full-size prompt is
    # over budget by a few tokens, a smaller image fits.
    ctx.worker.cost.coefficients  # fit the warm-up steps now, so the costs below stay put
    ctx.worker.cost._coef[:] = [0.0, 0.01, 0.0]
    ctx.worker.cost.encode_s_per_token = 0.0
    body = {"model": "kimi", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": to_data_url(BIG)}},
        {"type": "text", "text": "What color?"}]}]}
    text_tokens = 20  # generous upper bound on the template + question tokens
    body["ttft_budget_ms"] = (full + text_tokens) * 10.0 - 10.0 * (full // 2)
    url = moonvit_server.url + "/v1/chat/completions"
    refused = httpx.post(url, json=body, timeout=60)
    assert refused.status_code == 429
    shrunk = httpx.post(url, json={**body, "shrink_images_to_budget": True}, timeout=60)
    assert shrunk.status_code == 200, shrunk.text
    prompt_tokens = shrunk.json()["usage"]["prompt_tokens"]
    assert prompt_tokens * 10.0 <= body["ttft_budget_ms"] and prompt_tokens < full + text_tokens
