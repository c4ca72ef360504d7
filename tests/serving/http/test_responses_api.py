"""POST /v1/responses (OpenAI's Responses API) through the official openai client: the same
answer as the chat it means (text, images, instructions, function calls, structured output,
thinking), the stream's events in OpenAI's order ending in the whole response, and one-line
400s naming the Responses field."""

import json

import httpx
import openai
import pytest
from PIL import Image

from graft.serving.multimodal.media import to_data_url
from tests.serving.http.conftest import LiveServer, serve_app

ASK = "Name a color."
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}  # it ends


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, messages, **fields):
    fields.setdefault("max_tokens", 10)
    return client.chat.completions.create(model="plain", messages=messages, temperature=0,
                                          **fields)


def respond(client, **fields):
    fields.setdefault("max_output_tokens", 10)
    return client.responses.create(model="plain", temperature=0, **fields)


def test_text_equals_the_chat_it_means(client):
    reply = respond(client, input=ASK, instructions="Answer in one word.")
    same = chat(client, [{"role": "system", "content": "Answer in one word."},
                         {"role": "user", "content": ASK}])
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.output_text == same.choices[0].message.content
    assert reply.usage.input_tokens == same.usage.prompt_tokens
    assert reply.usage.output_tokens == same.usage.completion_tokens
    assert reply.status == ("incomplete" if same.choices[0].finish_reason == "length"
                            else "completed")
    assert [item.type for item in reply.output] == ["message"]
    listed = respond(client, input=[{"role": "user", "content": [
        {"type": "input_text", "text": ASK}]}])
    assert listed.output_text == chat(client, [{"role": "user", "content": ASK}]).choices[
        0].message.content


def test_the_stream_builds_the_same_response(client):
    whole = respond(client, input=ASK, top_logprobs=2)
    events = list(respond(client, input=ASK, top_logprobs=2, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = events[3].part  # each event as it was when sent, not as the item grew after
    assert added.text == "" and not added.logprobs and not events[2].item.content[0].text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text and events[-1].response.output_text == text
    streamed = [lp.token for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert streamed == [lp.token for lp in whole.output[0].content[0].logprobs]
    assert len(streamed) == whole.usage.output_tokens


def test_function_calls_and_their_outputs(client):
    reply = respond(client, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                    max_output_tokens=60)
    (call,) = [item for item in reply.output if item.type == "function_call"]
    assert call.name == "get_weather" and "city" in json.loads(call.arguments)
    events = list(respond(client, input="Weather in Paris?", tools=[WEATHER],
                          tool_choice="required", max_output_tokens=60, stream=True))
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == call.arguments
    follow = respond(client, tools=[WEATHER], input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name,
         "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert follow.status in ("completed", "incomplete")


def test_text_format_json_schema(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    reply = respond(client, input=ASK, max_output_tokens=40, text={"format": {
        "type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    assert json.loads(reply.output_text) in ({"ok": True}, {"ok": False})


def test_an_image_in_the_input(live_server):
    client = openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused", max_retries=0)
    url = to_data_url(Image.new("RGB", (32, 32), (220, 20, 20)))
    reply = client.responses.create(model="tiny", temperature=0, max_output_tokens=8, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": url},
                                     {"type": "input_text", "text": "What color?"}]}])
    same = client.chat.completions.create(model="tiny", temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                     {"type": "text", "text": "What color?"}]}])
    assert reply.output_text == same.choices[0].message.content
    assert reply.usage.input_tokens == same.usage.prompt_tokens


def test_thinking_is_a_reasoning_item(tiny_llama):
    app = serve_app(str(tiny_llama), "--served-model-name", "r1", "--reasoning-parser",
                    "deepseek_r1", "--num-kv-blocks", "32")
    with LiveServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        reply = client.responses.create(model="r1", input=ASK, temperature=0,
                                        max_output_tokens=12)
        events = list(client.responses.create(model="r1", input=ASK, temperature=0,
                                              max_output_tokens=12, stream=True))
    # the random tiny model writes no </think>: all of it is thinking (deepseek_r1's rule)
    assert [item.type for item in reply.output] == ["reasoning"]
    thought = reply.output[0].content[0].text
    assert thought and reply.output_text == ""
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    assert [i.type for i in events[-1].response.output] == ["reasoning"]


@pytest.mark.parametrize("fields,param", [
    ({"input": ASK, "previous_response_id": "resp_1"}, "previous_response_id"),  # none kept
    ({"input": ASK, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "computer_call"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": ASK}, {"role": "robot", "content": "x"}]},
     "input[1].role"),
    ({"input": ASK, "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": ASK, "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": ASK, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0].type"),
    ({"input": ASK, "text": {"format": {"type": "json_schema", "name": "x",
                                         "schema": {"type": "foo"}}}}, "text.format"),
    ({"input": "x" * 1_000_000}, "input"),
    ({}, "model"),
])
def test_bad_requests_are_one_line_400s_naming_the_field(plain_server, fields, param):
    body = {"model": "plain", **fields} if fields else {"input": ASK}
    resp = httpx.post(plain_server.url + "/v1/responses", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["param"] == param and "\n" not in err["message"], err
    for chat_word in ("messages", "response_format", "max_completion_tokens"):
        assert chat_word not in err["message"], err  # the Responses request's own words


def test_a_kept_response_is_continued_read_and_deleted(tiny_llama_2k):
    app = serve_app(str(tiny_llama_2k), "--served-model-name", "plain", "--num-kv-blocks", "64",
                    "--responses-store-mb", "1")
    with LiveServer(app) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        first = client.responses.create(model="plain", input=ASK, temperature=0,
                                        max_output_tokens=6)
        assert first.store is True
        assert client.responses.retrieve(first.id).output_text == first.output_text
        follow = client.responses.create(model="plain", input="And another?", temperature=0,
                                         max_output_tokens=6, previous_response_id=first.id)
        whole = chat(client, [{"role": "user", "content": ASK},
                              {"role": "assistant", "content": first.output_text},
                              {"role": "user", "content": "And another?"}], max_tokens=6)
        assert follow.output_text == whole.choices[0].message.content
        assert follow.usage.input_tokens == whole.usage.prompt_tokens
        assert follow.previous_response_id == first.id
        streamed = list(client.responses.create(model="plain", input="More?", stream=True,
                                                max_output_tokens=4,
                                                previous_response_id=follow.id))
        assert client.responses.retrieve(streamed[-1].response.id).output_text == \
            streamed[-1].response.output_text
        unkept = client.responses.create(model="plain", input=ASK, store=False,
                                         max_output_tokens=2)
        client.responses.delete(first.id)
        for gone in (first.id, unkept.id):
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(gone)
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model="plain", input="x", previous_response_id=first.id)
        assert err.value.body["param"] == "previous_response_id"


def test_without_a_store_nothing_is_kept(client):
    reply = respond(client, input=ASK)
    assert reply.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(reply.id)


def test_the_store_keeps_the_latest_within_its_bytes():
    from graft.serving.http.openai.responses_store import ResponseStore

    def response(rid, text):
        return {"id": rid, "output": [{"type": "message", "content": [{"text": text}]}]}

    one = len(json.dumps(response("r0", "x" * 100))) + len(json.dumps([]))
    store = ResponseStore(max_bytes=3 * one)
    for i in range(3):
        store.put(response(f"r{i}", "x" * 100), [])
    assert store.get("r0") is not None  # now the most recent: r1 goes first
    store.put(response("r3", "x" * 100), [])
    assert [rid for rid in ("r0", "r1", "r2", "r3") if store.get(rid)] == ["r0", "r2", "r3"]
    store.put(response("big", "x" * 4 * one), [])  # bigger than the whole store: not kept
    assert store.get("big") is None and store.get("r3") is not None
    assert store.delete("r3") and not store.delete("r3")
