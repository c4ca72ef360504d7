"""`graft serve --kv-cache-dtype int8`: the engine's pool is int8 and a chat with an image is
answered with the tokens the same engine config gives offline."""

import httpx
from PIL import Image

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.serving.multimodal import generate_chats
from graft.serving.multimodal.media import to_data_url
from tests.serving.http.conftest import LiveServer, serve_app

RED = Image.new("RGB", (32, 32), (220, 20, 20))


def test_serve_with_an_int8_kv_cache(tiny_run_dir):
    app = serve_app(str(tiny_run_dir), "--served-model-name", "tiny", "--kv-cache-dtype", "int8",
                    "--num-kv-blocks", "32")
    engine = app.state.ctx.engine
    assert engine.config.kv_cache_dtype == "int8" and engine.runner.kv_scales is not None
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": to_data_url(RED)}},
        {"type": "text", "text": "What color?"}]}]}
    with LiveServer(app) as live:
        reply = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=60).json()
    offline = Engine.from_pretrained(tiny_run_dir, EngineConfig(num_kv_blocks=32,
                                                                kv_cache_dtype="int8"))
    chat = [{"role": "user", "content": "<image>\nWhat color?"}]
    want = generate_chats(offline, {"r": (chat, [RED])},
                          SamplingParams(temperature=0.0, max_tokens=6))["r"]
    assert reply["choices"][0]["message"]["content"] == want.text
