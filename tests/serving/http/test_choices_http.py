"""Several choices in one answer (serving/http/openai/choices.py): /v1/completions' list of
prompts and `n` > 1 on chat and completions, whole and streamed, each choice equal to the same
request asked alone; a refused prompt or a client that goes away leaves nothing behind."""

import json

import httpx
import openai
import pytest

from tests.serving.http.conftest import settled

PROMPTS = ["The quick brown fox", "Once upon a time", "1, 2, 3,"]


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


def complete(client, **fields):
    fields.setdefault("max_tokens", 8)
    return client.completions.create(model="plain", extra_body={"ignore_eos": True}, **fields)


def test_a_list_of_prompts_answers_each_in_order(client, plain_server):
    alone = [complete(client, prompt=p, temperature=0) for p in PROMPTS]
    reply = complete(client, prompt=PROMPTS, temperature=0, logprobs=1)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == [a.choices[0].text for a in alone]
    assert all(len(c.logprobs.tokens) == 8 for c in reply.choices)
    assert reply.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert reply.usage.completion_tokens == 24
    tokenizer = plain_server.app.state.ctx.tokenizer
    tokenized = [tokenizer(p, add_special_tokens=True)["input_ids"] for p in PROMPTS]
    by_ids = complete(client, prompt=tokenized, temperature=0)
    assert [c.text for c in by_ids.choices] == [a.choices[0].text for a in alone]


def test_n_samples_are_seeded_as_vllm_seeds_them(client):
    """Choice j of a seeded request is the request alone with seed + j."""
    reply = complete(client, prompt=PROMPTS[0], n=3, seed=7, temperature=1.0)
    alone = [complete(client, prompt=PROMPTS[0], seed=7 + j, temperature=1.0).choices[0].text
             for j in range(3)]
    assert [c.text for c in reply.choices] == alone
    assert len(set(alone)) > 1  # three samples of a random model, not one answer thrice
    assert reply.usage.prompt_tokens == complete(client, prompt=PROMPTS[0]).usage.prompt_tokens
    assert reply.usage.completion_tokens == 24


def test_prompts_times_n_order_and_stream(client):
    whole = complete(client, prompt=PROMPTS[:2], n=2, seed=3, temperature=1.0)
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert whole.choices[0].text == complete(client, prompt=PROMPTS[0], seed=3,
                                             temperature=1.0).choices[0].text
    assert whole.choices[2].text == complete(client, prompt=PROMPTS[1], seed=3,
                                             temperature=1.0).choices[0].text
    chunks = list(complete(client, prompt=PROMPTS[:2], n=2, seed=3, temperature=1.0,
                           stream=True, stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1
    texts, reasons = ["", "", "", ""], [[], [], [], []]
    for chunk in chunks[:-1]:
        for c in chunk.choices:
            texts[c.index] += c.text
            reasons[c.index] += [c.finish_reason] if c.finish_reason else []
    assert texts == [c.text for c in whole.choices]
    assert reasons == [["length"]] * 4
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 32
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_n(plain_server):
    body = {"model": "plain", "max_tokens": 6, "temperature": 0, "n": 2, "ignore_eos": True,
            "messages": [{"role": "user", "content": "Name a color."}]}
    reply = httpx.post(plain_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    one = httpx.post(plain_server.url + "/v1/chat/completions", json={**body, "n": 1},
                     timeout=60).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in reply["choices"]] == \
        [one["choices"][0]["message"]["content"]] * 2  # greedy: the same answer twice
    assert reply["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert reply["usage"]["completion_tokens"] == 12
    with httpx.stream("POST", plain_server.url + "/v1/chat/completions",
                      json={**body, "stream": True}, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    roles = [c["index"] for e in events for c in e["choices"] if c["delta"].get("role")]
    assert sorted(roles) == [0, 1]


@pytest.mark.parametrize("fields,param", [
    ({"prompt": ["a", "b"], "kv_transfer_params": {"do_remote_decode": True}}, "prompt"),
    ({"prompt": "a", "n": 2, "kv_transfer_params": {"do_remote_decode": True}}, "n"),
])
def test_several_choices_do_not_split_prefill_and_decode(plain_server, fields, param):
    reply = httpx.post(plain_server.url + "/v1/completions", json={"model": "plain", **fields},
                       timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param


def test_a_refused_prompt_refuses_all_and_leaks_nothing(plain_server, client):
    used, metrics = settled(plain_server), plain_server.app.state.ctx.metrics
    with pytest.raises(openai.BadRequestError) as err:
        complete(client, prompt=[[5, 6], [7, 10 ** 6]])
    assert err.value.body["param"] == "prompt[1][1]"
    assert settled(plain_server) == used
    aborted = metrics.aborted.value
    with pytest.raises(openai.BadRequestError) as err:  # the second refused after the first
        complete(client, prompt=["short", "word " * 400], max_tokens=2000)  # was submitted
    assert err.value.body["param"] == "prompt[1]"
    assert settled(plain_server) == used
    assert metrics.aborted.value == aborted + 1  # the first, not left to run 2000 tokens


def test_a_client_that_goes_away_aborts_every_choice(plain_server):
    used = settled(plain_server)
    body = {"model": "plain", "prompt": PROMPTS, "n": 2, "max_tokens": 1500,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", plain_server.url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # hang up after the first chunk
    assert settled(plain_server) == used
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(plain_server.url + "/v1/completions", json={**body, "stream": False},
                   timeout=0.5)
    assert settled(plain_server) == used
