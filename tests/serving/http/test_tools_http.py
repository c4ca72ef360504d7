"""tools / tool_choice through the official openai client against the real server. The tiny
random model never calls a tool by itself, so "auto" is checked by the prompt the server
built (the tools are in it) and by the real SSE path fed with Hermes output; "required" and
a named function (constrained decoding) end to end."""

import asyncio
import json

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from graft.serving import SamplingParams
from graft.serving.engine.outputs import RequestOutput
from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.chat_answer import ChatAnswer
from graft.serving.http.job import Job
from graft.serving.http.openai.responses import stream
from graft.serving.http.openai.tool_prompt import HERMES_TOOLS
from tests.serving.http.test_tool_calls import HISTORY, NAMES, PARALLEL, TOOL_TEMPLATE, WEATHER

# arguments a grammar keeps short on a random model: an enum and a boolean, nothing open-ended
FORECAST = {"type": "function", "function": {
    "name": "forecast", "description": "The forecast for a city.",
    "parameters": {"type": "object", "additionalProperties": False,
                   "required": ["city", "tomorrow"],
                   "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                  "tomorrow": {"type": "boolean"}}}}}
ASK = [{"role": "user", "content": "Weather in Paris tomorrow?"}]


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


def chat(client, **fields):
    fields.setdefault("messages", ASK)
    return client.chat.completions.create(model="plain", temperature=0, **fields)


def test_auto_puts_the_tools_in_the_prompt(client, plain_server):
    ctx = plain_server.app.state.ctx
    body = {"model": "plain", "messages": ASK, "tools": [WEATHER]}
    er = ctx.prepare(P.parse_chat_request(json.dumps(body).encode()), None)
    prompt = ctx.tokenizer.decode(er.ids)
    assert HERMES_TOOLS.split("{tools}")[0] + json.dumps(WEATHER) in prompt
    reply = chat(client, tools=[WEATHER], max_tokens=6)
    assert reply.usage.prompt_tokens == len(er.ids)  # the served prompt is that one
    assert reply.choices[0].finish_reason in ("stop", "length")
    plain = chat(client, tools=[WEATHER], tool_choice="none", max_tokens=6)
    assert plain.usage.prompt_tokens < len(er.ids)  # "none": no tools in the prompt


def test_tool_history_is_accepted(client):
    reply = chat(client, messages=HISTORY, tools=[WEATHER], max_tokens=4)
    assert reply.choices[0].message.role == "assistant"


@pytest.mark.parametrize("fields,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, "tools"),
    ({"messages": [ASK[0], {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "not json"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tools_are_400s_naming_the_field(client, fields, param):
    fields.setdefault("tools", [WEATHER])
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, max_tokens=4, **fields)
    assert err.value.body["param"] == param and "\n" not in err.value.body["message"]


def hermes_outputs(tokenizer, text):
    """The RequestOutputs an engine step by step would send for `text` (one token a step)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [RequestOutput("chatcmpl-t", [1, 2], ids[:i], tokenizer.decode(ids[:i]),
                          finished=i == len(ids), finish_reason="stop" if i == len(ids) else None)
            for i in range(1, len(ids) + 1)]


def test_streamed_tool_calls_reassemble_in_the_openai_client(plain_server):
    """The server's SSE path fed with a Hermes answer: the openai client's own stream
    accumulator gets the same tool_calls as the non-streaming body."""
    ctx = plain_server.app.state.ctx
    tools = [WEATHER, {"type": "function", "function": {"name": NAMES[1]}}]
    req = P.parse_chat_request(json.dumps(
        {"model": "plain", "messages": ASK, "tools": tools, "stream": True}).encode())
    outputs = hermes_outputs(ctx.tokenizer, "Checking.\n" + PARALLEL)

    async def events():
        queue: asyncio.Queue = asyncio.Queue()
        for out in outputs:
            queue.put_nowait(("output", out))
        job = Job("chatcmpl-t", [1, 2], SamplingParams(), sink=lambda *a: None)
        watcher = asyncio.create_task(asyncio.sleep(3600))
        return [e async for e in stream(ctx, job, queue, ChatAnswer(ctx, job, req), False,
                                        watcher)]

    lines = [e.decode().removeprefix("data: ").strip() for e in asyncio.run(events())]
    assert lines[-1] == "[DONE]"
    state = ChatCompletionStreamState()
    for line in lines[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate_json(line))
    streamed = state.get_final_completion().choices[0]
    job = Job("chatcmpl-t", [1, 2], SamplingParams(), sink=lambda *a: None)
    whole = ChatCompletion.model_validate(ChatAnswer(ctx, job, req).whole(outputs[-1], "stop"))
    for choice in (streamed, whole.choices[0]):
        assert choice.finish_reason == "tool_calls"
        assert choice.message.content == "Checking."
        calls = choice.message.tool_calls
        assert [c.function.name for c in calls] == NAMES
        assert json.loads(calls[1].function.arguments)["date"] == "2024-10-01"
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]


def test_a_llama3_json_server_reads_llama_calls(tiny_llama_2k):
    """`graft serve --tool-call-parser llama3_json` (and vLLM's --enable-auto-tool-choice): a
    Llama 3.1 answer of two JSON calls is two tool_calls, not content."""
    from tests.serving.http.conftest import serve_app
    from tests.serving.http.test_tool_calls import LLAMA_TWO

    app = serve_app(str(tiny_llama_2k), "--served-model-name", "plain", "--num-kv-blocks", "32",
                    "--enable-auto-tool-choice", "--tool-call-parser", "llama3_json")
    ctx = app.state.ctx
    tools = [WEATHER, {"type": "function", "function": {"name": NAMES[1]}}]
    req = P.parse_chat_request(json.dumps({"model": "plain", "messages": ASK,
                                           "tools": tools}).encode())
    job = Job("chatcmpl-t", [1, 2], SamplingParams(), sink=lambda *a: None)
    out = hermes_outputs(ctx.tokenizer, LLAMA_TWO)[-1]
    choice = ChatCompletion.model_validate(ChatAnswer(ctx, job, req).whole(out, "stop")).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [c.function.name for c in choice.message.tool_calls] == NAMES


def check_forecast_calls(choice, reason="tool_calls"):
    assert choice.finish_reason == reason
    for call in choice.message.tool_calls:
        args = json.loads(call.function.arguments)
        assert call.function.name == "forecast" and call.id.startswith("call_")
        assert args["city"] in ("Paris", "Oslo") and isinstance(args["tomorrow"], bool)
    return [(c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls]


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "forecast"}}])
def test_required_and_named_give_tool_calls(client, choice):
    # required: one tool (WEATHER's open-ended string could run to max_tokens); named: the
    # other tool is offered but not chosen
    fields = dict(tools=[FORECAST] if choice == "required" else [WEATHER, FORECAST],
                  tool_choice=choice, max_tokens=300)
    # OpenAI's (and vLLM's) finish_reason: "tool_calls" for "required", "stop" for a named one
    reason = "tool_calls" if choice == "required" else "stop"
    calls = check_forecast_calls(chat(client, **fields).choices[0], reason)
    state = ChatCompletionStreamState()
    for chunk in chat(client, stream=True, **fields):
        state.handle_chunk(chunk)
    assert check_forecast_calls(state.get_final_completion().choices[0], reason) == calls


def test_required_tools_and_a_response_format_do_not_mix(client):
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, tools=[FORECAST], tool_choice="required", max_tokens=8,
             response_format={"type": "json_object"})
    assert err.value.body["param"] == "response_format"


@pytest.fixture(scope="module")
def graft_server(tmp_path_factory, tiny_llama_2k, tiny_encoder_config):
    """A run dir (SigLIP + projector over the 2k-context tiny Llama) served as "g", its LLM's
    chat template one that takes tools (as Qwen2.5's does)."""
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app
    from tests.conftest import _write_run
    from tests.serving.http.conftest import LiveServer

    run = _write_run(tmp_path_factory.mktemp("tools_run"), "run",
                     tiny_encoder_config("siglip"), tiny_llama_2k, 0)
    engine = Engine.from_pretrained(run, EngineConfig(num_kv_blocks=192))
    engine.tokenizer.chat_template = TOOL_TEMPLATE  # (every graft shares this tokenizer)
    with LiveServer(build_app(engine, ServerSettings(model_name="g"))) as server:
        yield server


def test_tools_beside_an_image(graft_server):
    """A graft's prompt (images spliced in by its front) gets the tools through its template."""
    from PIL import Image

    from graft.inject import IMAGE_PLACEHOLDER
    from graft.serving.multimodal.media import to_data_url

    url = to_data_url(Image.new("RGB", (32, 32), (200, 30, 30)))
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Weather where this was taken?"}]}]
    ctx = graft_server.app.state.ctx
    body = {"model": "g", "messages": messages, "tools": [WEATHER]}
    er = ctx.prepare(P.parse_chat_request(json.dumps(body).encode()), ctx.models["g"])
    ids = er.prepared.prompt_token_ids
    assert er.template["tools"] == [WEATHER]
    text = ctx.tokenizer.decode([t for t in ids if t != IMAGE_PLACEHOLDER])
    assert text.startswith("<|im_start|>system\nTOOLS:" + json.dumps(WEATHER))
    assert ids.count(IMAGE_PLACEHOLDER) == er.prepared.images[0].n_tokens
    client = openai.OpenAI(base_url=graft_server.url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="g", messages=messages, tools=[WEATHER],
                                           max_tokens=4, temperature=0)
    assert reply.usage.prompt_tokens == len(ids)
