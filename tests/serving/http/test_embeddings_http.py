"""POST /v1/embeddings through the official openai client against the real server: each
vector equal to HF transformers' last_hidden_state pooled and normalized, float and base64
alike, text and token ids alike; vLLM's chat form (images through a graft), truncation and
pooling flags; one-line 400s naming the field, and nothing left behind by a refusal or a
client that goes away."""


import httpx
import numpy as np
import openai
import pytest
import torch
from PIL import Image

from graft.serving.multimodal.media import to_data_url
from tests.serving.http.conftest import LiveServer, serve_app, settled

TEXTS = ["The quick brown fox", "Once upon a time", "1"]
_HF = {}


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


def hf_pooled(model_dir, ids, kind="last", normalize=True) -> np.ndarray:
    from transformers import AutoModel

    if str(model_dir) not in _HF:
        _HF[str(model_dir)] = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hidden = _HF[str(model_dir)](torch.tensor([ids])).last_hidden_state[0]
    v = hidden[-1] if kind == "last" else hidden.mean(dim=0)
    return (torch.nn.functional.normalize(v, dim=0) if normalize else v).numpy()


def ids_of(server, text):
    return server.app.state.ctx.tokenizer(text, add_special_tokens=True)["input_ids"]


def post(server, body, timeout=60):
    return httpx.post(server.url + "/v1/embeddings", json={"model": "plain", **body},
                      timeout=timeout)


def test_embeddings_equal_hf(client, plain_server, tiny_llama_2k):
    metrics = plain_server.app.state.ctx.metrics
    before = metrics.prompt_tokens.value
    reply = client.embeddings.create(model="plain", input=TEXTS)  # base64 on the wire
    ids = [ids_of(plain_server, t) for t in TEXTS]
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.object == "list"
    for row, d in zip(ids, reply.data):
        assert np.allclose(d.embedding, hf_pooled(tiny_llama_2k, row), atol=1e-5)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, ids))
    assert metrics.prompt_tokens.value == before + sum(map(len, ids))  # vllm:prompt_tokens too
    floats = client.embeddings.create(model="plain", input=TEXTS, encoding_format="float")
    by_ids = client.embeddings.create(model="plain", input=ids, encoding_format="float")
    alone = client.embeddings.create(model="plain", input=ids[0], encoding_format="float")
    # (a repeat takes prefix-cache hits: its last token alone is computed, by other kernels)
    for a, b, c in zip(reply.data, floats.data, by_ids.data):
        assert np.allclose(a.embedding, b.embedding, atol=1e-6)
        assert np.allclose(a.embedding, c.embedding, atol=1e-6)
    assert np.allclose(alone.data[0].embedding, floats.data[0].embedding, atol=1e-6)


def test_unnormalized_truncated_and_dimensions(plain_server, tiny_llama_2k):
    row = ids_of(plain_server, TEXTS[0])
    raw = post(plain_server, {"input": TEXTS[0], "use_activation": False}).json()
    assert np.allclose(raw["data"][0]["embedding"], hf_pooled(tiny_llama_2k, row,
                                                              normalize=False), atol=1e-4)
    older = post(plain_server, {"input": TEXTS[0], "normalize": False}).json()  # vLLM's old name
    assert older["data"] == raw["data"]
    long = " ".join(["word"] * 40)
    ids = ids_of(plain_server, long)
    for side, kept in (("left", ids[-8:]), ("right", ids[:8])):
        body = post(plain_server, {"input": long, "truncate_prompt_tokens": 8,
                                   "truncation_side": side}).json()
        assert body["usage"]["prompt_tokens"] == 8
        assert np.allclose(body["data"][0]["embedding"], hf_pooled(tiny_llama_2k, kept),
                           atol=1e-5)
    hidden = plain_server.app.state.ctx.engine.runner.hidden_size
    assert post(plain_server, {"input": "a", "dimensions": hidden}).status_code == 200


def test_a_chat_is_embedded_as_its_template_writes_it(plain_server, tiny_llama_2k):
    from graft.template import encode_chat

    messages = [{"role": "user", "content": "Which fox is quick?"}]
    body = post(plain_server, {"messages": messages}).json()
    ids = encode_chat(plain_server.app.state.ctx.tokenizer, messages, []).input_ids
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert np.allclose(body["data"][0]["embedding"], hf_pooled(tiny_llama_2k, ids), atol=1e-5)


@pytest.mark.parametrize("body, param", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": ["a", ""]}, "input"),
    ({"input": [[1, 2], [1, 10 ** 6]]}, "input[1][1]"), ({"input": [5, -1]}, "input[1]"),
    ({"input": "word " * 3000}, "input"), ({"input": ["a", "word " * 3000]}, "input[1]"),
    ({"input": "a", "dimensions": 7}, "dimensions"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "encoding_format": "bytes"}, "encoding_format"),
    ({"input": "a", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({"input": "a", "truncate_prompt_tokens": 0}, "input"),
    ({"input": "a", "use_activation": True, "normalize": False}, None),
    ({"input": "a", "messages": [{"role": "user", "content": "b"}]}, None), ({}, None),
    ({"messages": [{"role": "user", "content": "b"}], "truncate_prompt_tokens": 4}, None),
    ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"input": "a", "model": "nope"}, "model"),
    ({"messages": [{"role": "user", "content": "b"}], "continue_final_message": True,
      "add_generation_prompt": True}, "continue_final_message"),
    ({"messages": [{"role": "user", "content": "b"}], "chat_template_kwargs": {"messages": 1}},
     "chat_template_kwargs"),
])
def test_bad_requests_are_one_line_4xx(plain_server, body, param):
    used = settled(plain_server)
    reply = post(plain_server, body)
    assert reply.status_code in (400, 404), reply.text
    error = reply.json()["error"]
    assert error["param"] == param and "\n" not in error["message"], error
    assert settled(plain_server) == used
    assert post(plain_server, {"input": "still here"}).status_code == 200


def test_a_missed_ttft_budget_is_a_429(plain_server):
    """Refused at admission or past its deadline in the engine: either way a 429 naming the
    budget, and the server goes on."""
    used = settled(plain_server)
    reply = post(plain_server, {"input": ["word " * 400] * 8, "ttft_budget_ms": 0.01})
    assert reply.status_code == 429 and reply.json()["error"]["param"] == "ttft_budget_ms"
    assert settled(plain_server) == used
    assert post(plain_server, {"input": "still here"}).status_code == 200


def test_a_client_that_goes_away_leaves_nothing_behind(plain_server):
    """Gone while its inputs are submitted or computed: whichever it was, every input is
    aborted or finished and no KV block stays taken."""
    used = settled(plain_server)
    with pytest.raises(httpx.ReadTimeout):
        post(plain_server, {"input": [f"{i} " + "word " * 400 for i in range(256)]},
             timeout=0.5)  # (distinct: no input is a prefix-cache hit)
    assert settled(plain_server, timeout=60) == used
    assert not plain_server.app.state.ctx.engine.has_unfinished_requests()
    assert post(plain_server, {"input": "still here"}).status_code == 200


def test_images_through_a_graft(live_server):
    def embed(color, text="What is this?"):
        image = Image.new("RGB", (32, 32), color)
        content = [{"type": "image_url", "image_url": {"url": to_data_url(image)}},
                   {"type": "text", "text": text}]
        reply = httpx.post(live_server.url + "/v1/embeddings", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": content}],
            "encoding_format": "float"})
        assert reply.status_code == 200, reply.text
        return np.array(reply.json()["data"][0]["embedding"]), reply.json()["usage"]

    red, usage = embed((220, 20, 20))
    assert np.allclose(red, embed((220, 20, 20))[0], atol=1e-6)  # (prefix-cache hits)
    assert not np.allclose(red, embed((20, 20, 220))[0], atol=1e-4)  # the image is seen
    assert abs(np.linalg.norm(red) - 1) < 1e-5
    text_only = live_server.app.state.ctx.tokenizer("What is this?")["input_ids"]
    assert usage["prompt_tokens"] > len(text_only)  # the image's placeholder run counts


def test_pooling_flag(tiny_llama_2k):
    app = serve_app(str(tiny_llama_2k), "--served-model-name", "plain", "--pooling", "mean",
                    "--num-kv-blocks", "32")
    with LiveServer(app) as server:
        body = post(server, {"input": TEXTS[0], "encoding_format": "float"}).json()
        want = hf_pooled(tiny_llama_2k, ids_of(server, TEXTS[0]), kind="mean")
        assert np.allclose(body["data"][0]["embedding"], want, atol=1e-5)
