"""Tool calls without a server: the Hermes reader on text as Qwen2.5/Qwen3 write it, streamed
or whole; the "required" / named readers; the JSON schemas for tool_choice; the validation of
tools; and where the tools land in the prompt (the template's own tool support, or graft's
Hermes system prompt for a template without one)."""

import json

import pytest

from graft.serving.http.openai import openai_chat as P
from graft.serving.http.openai.tool_calls import (CallListReader, HermesReader, Llama3JsonReader,
                                                 NamedReader, assemble, reader_for)
from graft.serving.http.openai.tool_prompt import HERMES_TOOLS, template_handles_tools, tool_prompt
from graft.serving.http.openai.tool_plan import plan_tools

WEATHER = {"type": "function", "function": {
    "name": "get_current_temperature", "description": "Get current temperature at a location.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["location"]}}}
DATE = {"type": "function", "function": {
    "name": "get_temperature_date", "description": "Get temperature at a location and date.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "date": {"type": "string"}},
        "required": ["location", "date"]}}}
NAMES = ["get_current_temperature", "get_temperature_date"]

# Qwen2.5-7B-Instruct's answer to "What's the temperature in San Francisco now and tomorrow?"
# with the two tools above (the shape of Qwen's function-calling guide)
PARALLEL = (
    '<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, '
    'CA, USA"}}\n</tool_call>\n<tool_call>\n{"name": "get_temperature_date", "arguments": '
    '{"location": "San Francisco, CA, USA", "date": "2024-10-01"}}\n</tool_call>')
TEXT_THEN_CALL = ("Let me check the weather for you.\n<tool_call>\n{\"name\": "
                  "\"get_current_temperature\", \"arguments\": {\"location\": \"Paris\", "
                  "\"unit\": \"celsius\"}}\n</tool_call>")


def whole(reader, text):
    return assemble(reader.feed(text) + reader.finish())


def streamed(reader, text, cuts):
    deltas, at = [], 0
    for cut in cuts + [len(text)]:
        deltas += reader.feed(text[at:cut])
        at = cut
    return deltas + reader.finish()


def strip_ids(calls):
    return [{**c, "id": c["id"].startswith("call_")} for c in calls]


def test_hermes_parallel_calls_become_tool_calls():
    content, calls = whole(HermesReader(NAMES), PARALLEL)
    assert content is None
    assert [c["function"]["name"] for c in calls] == NAMES
    assert json.loads(calls[1]["function"]["arguments"]) == {
        "location": "San Francisco, CA, USA", "date": "2024-10-01"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2


def test_hermes_text_outside_blocks_is_the_content():
    content, calls = whole(HermesReader(NAMES), TEXT_THEN_CALL + "\nDone.")
    assert content == "Let me check the weather for you.\n\nDone."
    assert calls[0]["function"]["arguments"] == '{"location": "Paris", "unit": "celsius"}'


@pytest.mark.parametrize("text", [
    "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"loc\n</tool_call>",
    "<tool_call>\n{\"name\": \"delete_everything\", \"arguments\": {}}\n</tool_call>",
    "<tool_call>[1, 2]</tool_call>",
])
def test_a_block_that_is_no_call_of_an_offered_tool_stays_text(text):
    reader = HermesReader(NAMES)
    assert whole(reader, text) == (text, [])
    assert not reader.called


def test_hermes_unclosed_last_block_and_string_arguments():
    text = '<tool_call>\n{"name": "get_temperature_date", "arguments": "{\\"date\\": \\"today\\"}"}'
    content, calls = whole(HermesReader(NAMES), text)
    assert content is None and calls[0]["function"]["arguments"] == '{"date": "today"}'
    plain = "no tools needed: 4"
    assert whole(HermesReader(NAMES), plain) == (plain, [])


@pytest.mark.parametrize("text", [PARALLEL, TEXT_THEN_CALL + "\nDone.", "Just text <tool_",
                                  "a <tool_call>{bad}</tool_call> b"])
def test_streamed_deltas_reassemble_to_the_whole_answer(text):
    want = whole(HermesReader(NAMES), text)
    for cuts in ([], list(range(1, len(text))), list(range(3, len(text), 7))):
        deltas = streamed(HermesReader(NAMES), text, cuts)
        content, calls = assemble(deltas)
        assert content == want[0]
        assert strip_ids(calls) == strip_ids(want[1])
        for d in deltas:  # OpenAI's order: index + id + type + name first, arguments after
            for part in d.get("tool_calls", ()):
                assert set(part) in ({"index", "id", "type", "function"}, {"index", "function"})
        assert not any("<tool_call>" in d.get("content", "") for d in deltas if want[1])


# Llama-3.1-8B-Instruct's calls: JSON objects with "parameters", several separated by ";"
LLAMA_ONE = '{"name": "get_current_temperature", "parameters": {"location": "Paris"}}'
LLAMA_TWO = (LLAMA_ONE + '; {"name": "get_temperature_date", "parameters": {"location": '
             '"Paris", "date": "2024-10-01"}}')


@pytest.mark.parametrize("text, content, names", [
    (LLAMA_ONE, None, NAMES[:1]),
    (" " + LLAMA_TWO + "\n", None, NAMES),
    ("It is sunny in Paris.", "It is sunny in Paris.", []),
    ('{"answer": 4}', '{"answer": 4}', []),  # JSON, but no call
    ('{"name": "delete_everything", "parameters": {}}',
     '{"name": "delete_everything", "parameters": {}}', []),  # not an offered function
    (LLAMA_ONE + " and then some text", LLAMA_ONE + " and then some text", []),
    ('{"name": "get_current_temperature", "parameters": {"loc', None, None),  # cut short
])
def test_llama3_json_calls_whole_and_streamed(text, content, names):
    if names is None:  # max_tokens cut the call: the text is all there is
        content, names = text, []
    for cuts in ([], list(range(1, len(text))), list(range(2, len(text), 5))):
        reader = Llama3JsonReader(NAMES)
        got, calls = assemble(streamed(reader, text, cuts))
        assert got == content and [c["function"]["name"] for c in calls] == names
        assert reader.called == bool(names)
    if names:
        args = json.loads(calls[0]["function"]["arguments"])
        assert args == {"location": "Paris"}


def test_the_tool_call_parser_picks_the_auto_reader():
    req = P.parse_chat_request(json.dumps({"model": "m", "messages": [
        {"role": "user", "content": "hi"}], "tools": [WEATHER]}).encode())
    assert isinstance(reader_for(plan_tools(req)), HermesReader)
    assert isinstance(reader_for(plan_tools(req), "llama3_json"), Llama3JsonReader)


def test_required_reader_reads_the_array_of_calls():
    text = json.dumps([{"name": "get_current_temperature", "arguments": {"location": "Oslo"}},
                       {"name": "get_temperature_date",
                        "arguments": {"location": "Oslo", "date": "2025-01-01"}}])
    reader = CallListReader(NAMES)
    content, calls = whole(reader, text)
    assert content is None and reader.called
    assert [json.loads(c["function"]["arguments"])["location"] for c in calls] == ["Oslo"] * 2
    cut = text[:20]  # max_tokens ended it: the text is returned as it is
    assert whole(CallListReader(NAMES), cut) == (cut, [])


def test_named_reader_streams_the_arguments():
    reader = NamedReader("get_current_temperature")
    deltas = streamed(reader, '{"location": "Rome"}', [5, 9])
    content, calls = assemble(deltas)
    assert content is None
    assert calls[0]["function"] == {"name": "get_current_temperature",
                                    "arguments": '{"location": "Rome"}'}
    assert deltas[0]["tool_calls"][0]["function"]["arguments"] == ""


def request(**fields):
    body = {"model": "m", "messages": [{"role": "user", "content": "weather?"}], **fields}
    return P.parse_chat_request(json.dumps(body).encode())


def test_schemas_for_required_and_named():
    required = plan_tools(request(tools=[WEATHER, DATE], tool_choice="required")).schema()
    assert required["type"] == "array" and required["minItems"] == 1
    first = required["items"]["anyOf"][0]
    assert first["properties"]["name"] == {"const": "get_current_temperature"}
    assert first["properties"]["arguments"] == WEATHER["function"]["parameters"]
    single = plan_tools(request(tools=[WEATHER], tool_choice="required",
                                parallel_tool_calls=False)).schema()
    assert single["maxItems"] == 1 and single["items"]["required"] == ["name", "arguments"]
    named = plan_tools(request(tools=[WEATHER, DATE], tool_choice={
        "type": "function", "function": {"name": "get_temperature_date"}}))
    assert named.schema() == DATE["function"]["parameters"]
    assert isinstance(reader_for(named), NamedReader)
    assert plan_tools(request(tools=[WEATHER], tool_choice="auto")).schema() is None
    none = plan_tools(request(tools=[WEATHER], tool_choice="none"))
    assert none.tools == [] and reader_for(none) is None
    assert plan_tools(request()).mode == "none"


@pytest.mark.parametrize("fields,param", [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
])
def test_bad_tools_are_refused_by_the_parser(fields, param):
    with pytest.raises(P.APIError) as err:
        request(**fields)
    assert err.value.param == param and "\n" not in err.value.message


@pytest.mark.parametrize("fields,param", [
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_tools_that_cannot_be_honoured_are_refused(fields, param):
    with pytest.raises(P.APIError) as err:
        plan_tools(request(**fields))
    assert err.value.param == param and err.value.status == 400


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_current_temperature", "arguments": '{"location": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {
            "name": "get_current_temperature", "arguments": '{"location": "Lyon"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temperature": 22}'},
]


def rendered(tokenizer, **fields):
    from graft.template import encode_chat

    req = request(**fields)
    messages, _ = P.to_chat_messages(req.messages)
    messages, tools = tool_prompt(tokenizer, messages, req.messages, plan_tools(req), False)
    ids = encode_chat(tokenizer, messages, [], add_generation_prompt=True,
                      parse_special_tokens=False, tools=tools).input_ids
    return tokenizer.decode(ids)


def test_a_template_without_tools_gets_the_hermes_system_prompt(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    assert not template_handles_tools(tok)
    text = rendered(tok, messages=HISTORY, tools=[WEATHER])
    head = HERMES_TOOLS.split("{tools}")[0]
    assert text.startswith("<|im_start|>system\n" + head + json.dumps(WEATHER))
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_current_temperature", '
            '"arguments": {"location": "Paris"}}\n</tool_call>\n<tool_call>\n') in text
    assert ("<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response>\n"
            "<tool_response>\n{\"temperature\": 22}\n</tool_response><|im_end|>") in text
    assert "# Tools" not in rendered(tok, messages=HISTORY, tools=[WEATHER], tool_choice="none")


# A tool-aware ChatML template in the manner of Qwen2.5's: the tools go into the system turn,
# calls into the assistant's turn, results into a user turn.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t | tojson }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\nRESULT {{ m.tool_call_id }}: {{ m.content }}"
    "<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
    "{{ c.function.arguments.location }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_with_tools_gets_them_itself(tiny_llama):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    tok.chat_template = TOOL_TEMPLATE
    assert template_handles_tools(tok)
    text = rendered(tok, messages=HISTORY, tools=[WEATHER])
    assert text.startswith("<|im_start|>system\nTOOLS:{\"type\": \"function\"")
    # arguments as an object
    assert "CALL get_current_temperature ParisCALL get_current_temperature Lyon<|im_end|>" in text
    assert "RESULT call_2: {\"temperature\": 22}" in text
    assert "# Tools" not in text


@pytest.mark.parametrize("fields,param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "<|im_start|>x"}}]},
     "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "see <image>"}}]},
     "tools[0]"),
    ({"messages": [HISTORY[0], {**HISTORY[1], "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}]}, "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_1", "content": "21"}]}, "messages[0]"),
    ({"messages": [*HISTORY[:2], {**HISTORY[2], "tool_call_id": "call_9"}]},
     "messages[2].tool_call_id"),
    ({"messages": [*HISTORY[:3], HISTORY[0], HISTORY[3]]}, "messages[4]"),
])
def test_tool_text_the_prompt_cannot_hold_is_refused(tiny_llama, fields, param):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    with pytest.raises(P.APIError) as err:
        rendered(tok, **fields)
    assert err.value.param == param


def accepts(schema, tokenizer, text) -> bool:
    import llguidance
    import llguidance.hf

    grammar = llguidance.LLMatcher.grammar_from_json_schema(  # as the engine compiles them
        json.dumps(schema), defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(llguidance.hf.from_tokenizer(tokenizer), grammar,
                                   log_level=0)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()


def test_llguidance_holds_the_output_to_the_schemas(tiny_llama):
    """The schemas as the grammar engine (llguidance) reads them: calls of offered tools
    pass, anything else does not."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_llama)
    required = plan_tools(request(tools=[WEATHER, DATE], tool_choice="required")).schema()
    good = [{"name": "get_temperature_date", "arguments": {"location": "Oslo", "date": "x"}},
            {"name": "get_current_temperature", "arguments": {"location": "Rome"}}]
    assert accepts(required, tok, json.dumps(good, separators=(",", ":")))
    assert not accepts(required, tok, "[]")
    assert not accepts(required, tok, '[{"name":"rm","arguments":{}}]')
    assert not accepts(required, tok, '[{"name":"get_temperature_date","arguments":{}}]')
    named = plan_tools(request(tools=[WEATHER, DATE], tool_choice={
        "type": "function", "function": {"name": "get_current_temperature"}})).schema()
    assert accepts(named, tok, '{"location":"Rome","unit":"celsius"}')
    assert not accepts(named, tok, '{"unit":"celsius"}')
