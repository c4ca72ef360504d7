"""An image graft over an MoE LLM (GLM-4.5 style) served by the engine: the same tokens as the
training-side GraftedModel (HF's MoE underneath), with image runs cut across prefill chunks."""

import pytest

from graft.serving import Engine, EngineConfig
from graft.serving.multimodal.front import generate_chats
from tests.conftest import _write_run
from tests.serving.multimodal.test_engine_mm import ASK, BLUE, GREEDY, RED, _hf_tokens


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, tiny_llm_factory, tiny_encoder_config):
    return _write_run(tmp_path_factory.mktemp("moe_run"), "moe", tiny_encoder_config("siglip"),
                      tiny_llm_factory("glm4_moe"), 0)


@pytest.mark.parametrize("budget", [64, 5])  # 5: every image run is cut across prefill chunks
def test_moe_graft_matches_grafted_model(moe_run, budget):
    from graft.model import GraftedModel

    engine = Engine.from_pretrained(moe_run, EngineConfig(
        block_size=4, num_kv_blocks=96, max_num_batched_tokens=budget))
    outs = generate_chats(engine, {"red": (ASK, [RED]), "blue": (ASK, [BLUE])}, GREEDY)
    hf = GraftedModel.from_run(moe_run)
    assert outs["red"].token_ids == _hf_tokens(hf, RED)
    assert outs["blue"].token_ids == _hf_tokens(hf, BLUE)
    assert outs["red"].token_ids != outs["blue"].token_ids  # the image really steers decoding


def test_graft_serve_answers_an_image_chat_on_the_moe_llm(moe_run):
    """`graft serve RUN_DIR` over HTTP: the reply is the engine's greedy text for the same chat."""
    import argparse

    import httpx

    from graft.serving.http import serve_cli
    from graft.serving.multimodal.media import to_data_url
    from tests.serving.http.conftest import LiveServer

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    app = serve_cli.build(parser.parse_args([str(moe_run), "--served-model-name", "moe",
                                             "--num-kv-blocks", "64"]))
    content = [{"type": "image_url", "image_url": {"url": to_data_url(BLUE)}},
               {"type": "text", "text": "What color is it?"}]
    with LiveServer(app) as server:
        reply = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
            "model": "moe", "messages": [{"role": "user", "content": content}],
            "max_tokens": GREEDY.max_tokens, "temperature": 0, "ignore_eos": True}).json()
    engine = Engine.from_pretrained(moe_run, EngineConfig(num_kv_blocks=64))
    want = generate_chats(engine, {"blue": (ASK, [BLUE])}, GREEDY)["blue"]
    assert reply["choices"][0]["message"]["content"] == want.text
    assert reply["usage"]["completion_tokens"] == len(want.token_ids)
