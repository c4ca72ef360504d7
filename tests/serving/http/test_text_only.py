"""`graft serve LLM_DIR`: a plain LLM dir serves text chats and refuses images clearly."""

import httpx
import pytest
from PIL import Image

from graft.serving import SamplingParams
from graft.serving.multimodal.media import to_data_url
from graft.template import encode_chat
from tests.serving.http.conftest import LiveServer

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def text_server(tiny_llama):
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app

    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32))
    assert getattr(engine, "mm", None) is None
    # the expected answer, straight from the engine before its server thread owns it
    ids = encode_chat(engine.tokenizer, HELLO, [], add_generation_prompt=True).input_ids
    (expected,) = engine.generate(prompt_token_ids=[ids], sampling_params=SamplingParams(
        temperature=0, max_tokens=4, ignore_eos=True))
    with LiveServer(build_app(engine, ServerSettings(model_name="plain"))) as server:
        server.expected = expected.text
        yield server


def test_text_chat_matches_engine_and_images_are_refused(text_server):
    url = text_server.url + "/v1/chat/completions"
    body = {"model": "plain", "messages": [dict(m) for m in HELLO],
            "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(url, json=body, timeout=60)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"] == text_server.expected
    image = {"type": "image_url", "image_url": {"url": to_data_url(Image.new("RGB", (8, 8)))}}
    body["messages"][0]["content"] = [image, {"type": "text", "text": "hi"}]
    refused = httpx.post(url, json=body, timeout=60)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "images_not_supported"
