"""The endpoints routers call (serving/http/fleet/), checked against vLLM's and SGLang's
response definitions (transcribed below from their sources, every field, extra ones
forbidden) and against what graft itself runs: a render's ids are the ids the chat prefills,
usage.prompt_tokens_details.cached_tokens is the prefix cache's count."""

from __future__ import annotations

from typing import Any, Optional

import httpx
import pytest
from PIL import Image
from pydantic import BaseModel, ConfigDict

from graft.serving.multimodal.media import to_data_url
from graft.template import encode_chat

RED = Image.new("RGB", (32, 32), (220, 20, 20))
BLUE = Image.new("RGB", (32, 32), (20, 20, 220))
LONG = "You are a careful assistant who answers in short sentences. " * 6


# -- vLLM: vllm/entrypoints/serve/tokenize/protocol.py, serve/disagg/protocol.py ------------
class _Exact(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TokenizeResponse(_Exact):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(_Exact):
    prompt: str


class PlaceholderRangeInfo(_Exact):
    offset: int
    length: int


class MultiModalFeatures(_Exact):
    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[PlaceholderRangeInfo]]
    kwargs_data: Optional[dict[str, list[Optional[str]]]] = None


class GenerateRequest(_Exact):
    request_id: str
    token_ids: list[int]
    features: Optional[MultiModalFeatures] = None
    sampling_params: dict[str, Any]  # vLLM's SamplingParams struct (graft sends a subset)
    model: Optional[str] = None
    stream: Optional[bool] = False
    stream_options: Optional[dict] = None
    cache_salt: Optional[str] = None
    priority: int = 0
    kv_transfer_params: Optional[dict[str, Any]] = None


# -- SGLang: python/sglang/srt/entrypoints/http_server.py (get_model_info, get_load) ---------
class SglangModelInfo(BaseModel):
    model_path: str
    tokenizer_path: Optional[str]
    is_generation: bool
    preferred_sampling_params: Optional[dict]
    weight_version: str
    has_image_understanding: bool
    has_audio_understanding: bool
    model_type: Optional[str]
    architectures: Optional[list[str]]


class SglangLoad(_Exact):
    rid: None
    http_worker_ipc: None
    dp_rank: Optional[int]
    num_reqs: int
    num_waiting_reqs: int
    num_tokens: int


def _post(server, path, body):
    return httpx.post(server.url + path, json=body, timeout=60)


def _chat(server, model, messages, **kw):
    body = {"model": model, "messages": messages, "max_tokens": 2, "temperature": 0, **kw}
    resp = _post(server, "/v1/chat/completions", body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _image_msgs(image, text="What color?"):
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": to_data_url(image)}},
        {"type": "text", "text": text}]}]


def _error(resp, status, param):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and err["message"], err
    return err


def test_tokenize_and_render_give_the_ids_a_chat_prefills(plain_server):
    msgs = [{"role": "system", "content": LONG}, {"role": "user", "content": "hello"}]
    ctx = plain_server.app.state.ctx
    expected = encode_chat(ctx.tokenizer, msgs, [], add_generation_prompt=True).input_ids
    tok = TokenizeResponse.model_validate(_post(plain_server, "/tokenize", {
        "model": "plain", "messages": msgs, "return_token_strs": True}).json())
    assert tok.tokens == expected and tok.count == len(expected)
    assert tok.max_model_len == ctx.max_model_len == 2048
    assert tok.token_strs == ctx.tokenizer.convert_ids_to_tokens(expected)
    # vllm-router's own render body: its defaults and no add_generation_prompt
    rendered = GenerateRequest.model_validate(_post(plain_server, "/v1/chat/completions/render", {
        "model": "plain", "messages": msgs, "stream": False, "logprobs": False,
        "continue_final_message": False, "skip_special_tokens": True,
        "separate_reasoning": True, "max_tokens": 7}).json())
    assert rendered.token_ids == expected and rendered.features is None
    assert rendered.model == "plain" and rendered.sampling_params["max_tokens"] == 7
    assert _chat(plain_server, "plain", msgs)["usage"]["prompt_tokens"] == len(expected)


def test_a_responses_render_gives_the_ids_of_the_chat_it_means(plain_server):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    chat = _post(plain_server, "/v1/chat/completions/render", {"model": "plain",
                                                              "messages": msgs}).json()
    rendered = GenerateRequest.model_validate(_post(plain_server, "/v1/responses/render", {
        "model": "plain", "instructions": "Be brief.", "input": "Hi there",
        "max_output_tokens": 5}).json())
    assert rendered.token_ids == chat["token_ids"] and rendered.sampling_params["max_tokens"] == 5
    answer = httpx.post(plain_server.url + "/v1/responses", timeout=60, json={
        "model": "plain", "instructions": "Be brief.", "input": "Hi there", "max_output_tokens": 1})
    assert answer.json()["usage"]["input_tokens"] == len(rendered.token_ids)
    _error(_post(plain_server, "/v1/responses/render", {"model": "plain", "input": [
        {"role": "user", "content": [{"type": "input_file"}]}]}), 400, "input[0].content[0].type")


def test_tokenize_prompt_and_detokenize_round_trip(plain_server):
    tok = plain_server.app.state.ctx.tokenizer
    text = "The quick brown fox"
    whole = TokenizeResponse.model_validate(
        _post(plain_server, "/tokenize", {"prompt": text}).json())  # model may be left out
    assert whole.tokens == tok(text)["input_ids"] and whole.token_strs is None
    bare = _post(plain_server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert bare["tokens"] == tok(text, add_special_tokens=False)["input_ids"]
    back = DetokenizeResponse.model_validate(
        _post(plain_server, "/detokenize", {"model": "plain", "tokens": bare["tokens"]}).json())
    assert back.prompt == text
    listed = _post(plain_server, "/v1/completions/render", {"model": "plain", "prompt": text,
                                                          "max_tokens": 3}).json()
    (one,) = [GenerateRequest.model_validate(r) for r in listed]  # vLLM answers a list
    assert one.token_ids == whole.tokens and one.sampling_params["max_tokens"] == 3
    two = _post(plain_server, "/v1/completions/render", {"model": "plain", "prompt": [
        whole.tokens, bare["tokens"]]}).json()
    assert [r["token_ids"] for r in two] == [whole.tokens, bare["tokens"]]


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {"model": "nope", "prompt": "hi"}, 404, "model"),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"}],
                   "continue_final_message": True}, 400, "continue_final_message"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {}, 400, "prompt"),
    ("/detokenize", {"tokens": [1, -5]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": "12"}, 400, "tokens"),
    ("/v1/chat/completions/render", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions/render", {"model": "nope", "messages": [
        {"role": "user", "content": "hi"}]}, 404, "model"),
    ("/v1/completions/render", {"prompt": [1, 10 ** 6]}, 400, "prompt[1]"),
    ("/v1/completions/render", {"prompt": [[1], [2, 10 ** 6]]}, 400, "prompt[1][1]"),
])
def test_bad_input_is_refused_by_field_and_the_server_keeps_serving(plain_server, path, body,
                                                                    status, param):
    err = _error(_post(plain_server, path, body), status, param)
    if path == "/tokenize" and "add_generation_prompt" in body:
        assert "add_generation_prompt" in err["message"]
    assert _post(plain_server, "/tokenize", {"prompt": "still here"}).status_code == 200


def test_render_of_an_image_chat_matches_the_prompt_the_engine_runs(live_server):
    from graft.serving.http.fleet.tokenize import placeholder_id

    ctx = live_server.app.state.ctx
    image_id = placeholder_id(ctx)
    front = ctx.models["tiny"]
    encoded = front.encode_calls
    red = GenerateRequest.model_validate(_post(live_server, "/v1/chat/completions/render", {
        "model": "tiny", "messages": _image_msgs(RED)}).json())
    (span,) = red.features.mm_placeholders["image"]
    assert span.length == 16  # SigLIP 32px: 16 tokens, one placeholder each
    assert red.token_ids[span.offset:span.offset + span.length] == [image_id] * 16
    assert red.token_ids.count(image_id) == 16 and image_id >= ctx.tokenizer.vocab_size
    (red_hash,) = red.features.mm_hashes["image"]
    # the same picture has the same hash whatever its encoding; another picture another one
    again = _post(live_server, "/v1/chat/completions/render", {
        "model": "tiny", "messages": _image_msgs(RED, "Again?")}).json()
    blue = _post(live_server, "/v1/chat/completions/render", {
        "model": "tiny", "messages": _image_msgs(BLUE)}).json()
    assert again["features"]["mm_hashes"]["image"] == [red_hash]
    assert blue["features"]["mm_hashes"]["image"] != [red_hash]
    assert blue["token_ids"] == red.token_ids  # ids alone cannot tell images apart
    assert front.encode_calls == encoded  # rendering sizes images, it never encodes them
    usage = _chat(live_server, "tiny", _image_msgs(RED))["usage"]
    assert usage["prompt_tokens"] == len(red.token_ids)
    tok = _post(live_server, "/tokenize", {"messages": _image_msgs(RED),
                                          "return_token_strs": True}).json()
    assert tok["tokens"] == red.token_ids and tok["token_strs"].count("<image>") == 16
    text = _post(live_server, "/detokenize", {"tokens": red.token_ids}).json()["prompt"]
    assert text.count("<image>") == 1 and "What color?" in text


def test_sglang_model_server_and_load_info(live_server):
    ctx = live_server.app.state.ctx
    info = httpx.get(live_server.url + "/get_model_info").json()
    assert httpx.get(live_server.url + "/model_info").json() == info
    model = SglangModelInfo.model_validate(info)
    assert model.model_type == "llama" and model.architectures == ["LlamaForCausalLM"]
    assert model.has_image_understanding and model.is_generation
    server = httpx.get(live_server.url + "/get_server_info").json()
    assert httpx.get(live_server.url + "/server_info").json()["served_model_name"] == "tiny"
    assert server["served_model_name"] == "tiny" and server["model_path"] == model.model_path
    assert server["page_size"] == ctx.engine.config.block_size
    assert server["max_total_num_tokens"] == ctx.kv_blocks()[1] * server["page_size"]
    (load,) = [SglangLoad.model_validate(x) for x in httpx.get(live_server.url + "/get_load").json()]
    used, _ = ctx.kv_blocks()
    assert load.num_tokens == used * server["page_size"]
    assert load.num_reqs >= load.num_waiting_reqs >= 0


def test_cached_tokens_in_usage_count_the_prefix_cache(plain_server):
    msgs = [{"role": "system", "content": "Cached-tokens test. " + LONG},
            {"role": "user", "content": "first"}]
    first = _chat(plain_server, "plain", msgs)["usage"]
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    msgs[1]["content"] = "second"
    second = _chat(plain_server, "plain", msgs)["usage"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    block = plain_server.app.state.ctx.engine.config.block_size
    # the shared system prompt's full blocks; never the whole prompt
    assert block <= cached < second["prompt_tokens"] and cached % block == 0
    # a stream's usage chunk and /v1/completions carry it too
    with httpx.stream("POST", plain_server.url + "/v1/chat/completions", timeout=60, json={
            "model": "plain", "messages": msgs, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}}) as resp:
        last = [line for line in resp.iter_lines() if line.startswith("data: {")][-1]
    assert '"prompt_tokens_details":{"cached_tokens":' in last
    ids = encode_chat(plain_server.app.state.ctx.tokenizer, msgs, [],
                      add_generation_prompt=True).input_ids
    done = _post(plain_server, "/v1/completions", {"model": "plain", "prompt": ids,
                                                   "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens_details"]["cached_tokens"] >= cached


def test_get_load_counts_waiting_prompts_as_sglang_does(tiny_llama):
    from graft.serving import Engine, EngineConfig, SamplingParams
    from graft.serving.http.context import ServerContext, ServerSettings
    from graft.serving.http.job import Job
    from graft.serving.http.fleet.server_info import get_load

    ctx = ServerContext(Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32)),
                        ServerSettings(model_name="m"))
    params = SamplingParams(max_tokens=2)
    ctx.engine.add_request("in-scheduler", prompt_token_ids=[5] * 30, sampling_params=params)
    ctx.worker.submit(Job("in-server", [7] * 12, params, sink=lambda *a: None), None)
    (load,) = get_load(ctx)  # nothing has run: no KV in use, 42 prompt tokens wait
    assert (load["num_tokens"], load["num_waiting_reqs"], load["num_reqs"]) == (42, 2, 2)
