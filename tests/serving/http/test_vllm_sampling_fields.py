"""vLLM's sampling fields on chat and text completions: stop_token_ids (the answer ends at the
first, its text left out), include_stop_str_in_output (the stop string kept),
skip_special_tokens, and priority (the waiting order); the answers are the engine's for the
same SamplingParams."""

import httpx
import pytest

from graft.serving import Engine, EngineConfig, SamplingParams
from graft.template import encode_chat
from tests.serving.http.conftest import LiveServer

ASK = [{"role": "user", "content": "hello"}]  # the tiny model answers it with text
N = 10


@pytest.fixture(scope="module")
def server(tiny_llama):
    from graft.serving.http.server import ServerSettings, build_app

    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32))
    ids = encode_chat(engine.tokenizer, ASK, [], add_generation_prompt=True).input_ids
    eos = engine.tokenizer.eos_token_id

    def run(**kw):  # before the server's thread owns the engine
        params = SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, **kw)
        return engine.generate(prompt_token_ids=[ids], sampling_params=params)[0]

    greedy = run()
    forced = {"skip": run(logit_bias={eos: 100}).text,
              "keep": run(logit_bias={eos: 100}, skip_special_tokens=False).text}
    with LiveServer(build_app(engine, ServerSettings(model_name="plain"))) as live:
        live.greedy, live.forced, live.eos = greedy, forced, eos
        yield live


def _chat(server, **fields):
    body = {"model": "plain", "messages": ASK, "max_tokens": N, "temperature": 0,
            "ignore_eos": True, **fields}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def _answer(server, **fields) -> tuple[str, str]:
    resp = _chat(server, **fields)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"]


def test_stop_token_ids_end_the_answer_before_the_token(server):
    tokens = server.greedy.token_ids
    k = next(i for i, t in enumerate(tokens) if t not in tokens[:i] and i > 0)
    tok = server.app.state.ctx.tokenizer
    assert _answer(server, stop_token_ids=[tokens[k]]) == (tok.decode(tokens[:k]), "stop")


def test_include_stop_str_in_output_keeps_the_stop_string(server):
    text = server.greedy.text
    stop = text[1:3]
    at = text.find(stop)
    assert _answer(server, stop=stop) == (text[:at], "stop")
    assert _answer(server, stop=stop, include_stop_str_in_output=True) == \
        (text[:at + len(stop)], "stop")


def test_skip_special_tokens_false_keeps_their_text(server):
    bias = {"logit_bias": {str(server.eos): 100}}
    assert "<|im_end|>" not in server.forced["skip"] and "<|im_end|>" in server.forced["keep"]
    assert _answer(server, **bias)[0] == server.forced["skip"]
    assert _answer(server, skip_special_tokens=False, **bias)[0] == server.forced["keep"]


def test_a_priority_outside_int32_is_a_400(server):
    resp = _chat(server, priority=2 ** 31)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "priority", resp.text


@pytest.mark.parametrize("ids", [[-1], [10 ** 6], ["7"]])
def test_bad_stop_token_ids_are_400s_naming_the_field(server, ids):
    resp = _chat(server, stop_token_ids=ids)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"].startswith("stop_token_ids"), resp.text


def test_priority_orders_the_waiting_requests(tiny_llama, monkeypatch):
    """One sequence at a time, slowed steps: of two requests waiting behind a running one,
    the lower priority value goes first, whichever came first."""
    import threading
    import time

    from graft.serving.http.server import ServerSettings, build_app

    engine = Engine.from_pretrained(tiny_llama, EngineConfig(num_kv_blocks=32, max_num_seqs=1))
    real = engine.step
    monkeypatch.setattr(engine, "step", lambda: time.sleep(0.01) or real())
    done: list[str] = []
    with LiveServer(build_app(engine, ServerSettings(model_name="plain"))) as live:
        def ask(name, priority, tokens):
            _answer(live, max_tokens=tokens, priority=priority)
            done.append(name)

        def wait_for(n_waiting, n_running=1):
            end = time.monotonic() + 30
            while (len(engine.scheduler.waiting), len(engine.scheduler.running)) != \
                    (n_waiting, n_running):
                assert time.monotonic() < end, "the requests did not queue"
                time.sleep(0.002)

        threads = [threading.Thread(target=ask, args=("first", 0, 150))]
        threads[0].start()
        wait_for(0)
        for name, priority in (("later", 5), ("urgent", -5)):
            threads.append(threading.Thread(target=ask, args=(name, priority, 2)))
            threads[-1].start()
            wait_for(len(threads) - 1)
        for t in threads:
            t.join(60)
    assert done == ["first", "urgent", "later"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_continuous_usage_stats_count_every_chunk(server, path):
    import json

    ask = {"messages": ASK} if "chat" in path else {"prompt": "hello"}
    resp = httpx.post(server.url + path, timeout=60, json={
        "model": "plain", "max_tokens": N, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}, **ask})
    events = [json.loads(line[6:]) for line in resp.text.splitlines()
              if line.startswith("data: {")]
    counts = [e["usage"]["completion_tokens"] for e in events]
    assert all("usage" in e for e in events) and counts == sorted(counts)
    assert counts[-1] == N and (counts[0] == 0 or "chat" not in path)  # the role chunk: 0
    (prompt,) = {e["usage"]["prompt_tokens"] for e in events}
    assert all(e["usage"]["total_tokens"] == prompt + c for e, c in zip(events, counts))


def _events(resp) -> list[dict]:
    import json

    return [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]


def test_stop_reason_names_the_stop_token_or_string(server):
    """vLLM's stop_reason: the stop token id, the stop string, None after eos or a length cut;
    on the finishing chunk of a stream too."""
    tokens, text = server.greedy.token_ids, server.greedy.text
    k = next(i for i, t in enumerate(tokens) if t not in tokens[:i] and i > 0)
    stop = text[1:3]
    eos_first = {"ignore_eos": False, "logit_bias": {str(server.eos): 100}}
    for fields, want in (({"stop_token_ids": [tokens[k]]}, tokens[k]), ({"stop": stop}, stop),
                         ({}, None), (eos_first, None)):
        choice = _chat(server, **fields).json()["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == \
            ("length" if not fields else "stop", want), fields
        last = _events(_chat(server, stream=True, **fields))[-1]["choices"][0]
        assert last["finish_reason"] is not None and last["stop_reason"] == want, fields


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_return_token_ids_gives_the_prompt_and_answer_ids(server, path):
    """vLLM's return_token_ids: the answer's ids in each choice (a stream: each chunk the ids
    since the last), the prompt's at the top (chat) or in the choice (text completions);
    without it, neither."""
    ask = {"messages": ASK} if "chat" in path else {"prompt": "hello"}
    body = {"model": "plain", "max_tokens": N, "temperature": 0, "ignore_eos": True, **ask}
    plain = httpx.post(server.url + path, json=body, timeout=60).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain
    whole = httpx.post(server.url + path, json={**body, "return_token_ids": True}, timeout=60).json()
    choice = whole["choices"][0]
    prompt = whole["prompt_token_ids"] if "chat" in path else choice["prompt_token_ids"]
    assert len(choice["token_ids"]) == N and prompt and len(prompt) == whole["usage"]["prompt_tokens"]
    if "chat" in path:
        assert choice["token_ids"] == server.greedy.token_ids
    events = _events(httpx.post(server.url + path, timeout=60,
                                json={**body, "return_token_ids": True, "stream": True}))
    streamed = [t for e in events for c in e["choices"] for t in c["token_ids"]]
    first = events[0] if "chat" in path else events[0]["choices"][0]
    assert streamed == choice["token_ids"] and first["prompt_token_ids"] == prompt
    assert sum("prompt_token_ids" in e or "prompt_token_ids" in e["choices"][0]
               for e in events) == 1
    two = httpx.post(server.url + "/v1/completions", timeout=60, json={
        "model": "plain", "max_tokens": 2, "prompt": ["hello", "hi there"],
        "return_token_ids": True}).json()
    assert [len(c["prompt_token_ids"]) for c in two["choices"]] == \
        [len(server.app.state.ctx.tokenizer(p)["input_ids"]) for p in ("hello", "hi there")]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_truncate_prompt_tokens_keeps_the_last_k(server, path):
    ask = {"messages": ASK} if "chat" in path else {"prompt": "hello there, my good friend"}
    body = {"model": "plain", "max_tokens": 2, "return_token_ids": True, **ask}

    def prompt_ids(reply: dict) -> list[int]:
        return reply["prompt_token_ids"] if "chat" in path else \
            reply["choices"][0]["prompt_token_ids"]

    whole = prompt_ids(httpx.post(server.url + path, json=body, timeout=60).json())
    cut = httpx.post(server.url + path, json={**body, "truncate_prompt_tokens": 3}, timeout=60)
    assert cut.status_code == 200, cut.text
    assert prompt_ids(cut.json()) == whole[-3:] and cut.json()["usage"]["prompt_tokens"] == 3
    kept = httpx.post(server.url + path, json={**body, "truncate_prompt_tokens": -1}, timeout=60)
    assert prompt_ids(kept.json()) == whole  # -1: the context's length, more than it has
    none = httpx.post(server.url + path, json={**body, "truncate_prompt_tokens": 0}, timeout=60)
    assert none.status_code == 400 and "has no tokens left" in none.json()["error"]["message"]


def test_truncate_prompt_tokens_never_cuts_an_image_prompt(live_server):
    from PIL import Image

    from graft.serving.multimodal.media import to_data_url

    url = to_data_url(Image.new("RGB", (32, 32), (220, 20, 20)))
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Color?"}]}]}
    reply = httpx.post(live_server.url + "/v1/chat/completions", timeout=60,
                       json={**body, "truncate_prompt_tokens": 5})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["param"] == "truncate_prompt_tokens", reply.text
    assert "only text-only prompts are cut" in error["message"]
    room = httpx.post(live_server.url + "/v1/chat/completions", timeout=60,
                      json={**body, "truncate_prompt_tokens": 200})  # no cut needed: answered
    assert room.status_code == 200, room.text


def test_allowed_token_ids_and_bad_words(server):
    from graft.serving.http.openai.sampling_knobs import bad_words_token_ids

    allowed = list(range(0, 384, 5))
    reply = _chat(server, allowed_token_ids=allowed, return_token_ids=True).json()
    assert set(reply["choices"][0]["token_ids"]) <= set(allowed)
    tok = server.app.state.ctx.tokenizer
    words = [tok.decode(server.greedy.token_ids[1:3]).strip()]
    banned = bad_words_token_ids(tok, words)
    ids = _chat(server, bad_words=words, return_token_ids=True).json()["choices"][0]["token_ids"]
    assert ids != server.greedy.token_ids and banned
    assert not any(ids[i:i + len(w)] == w for w in banned for i in range(len(ids)))
    for bad, param in (({"allowed_token_ids": []}, "allowed_token_ids"),
                       ({"allowed_token_ids": [10 ** 6]}, "allowed_token_ids"),
                       ({"bad_words": [""]}, "bad_words[0]")):
        resp = _chat(server, **bad)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("field,value,words", [
    ("use_beam_search", True, "beam search is not implemented"),
    ("best_of", 3, "best_of is not implemented"),
    ("prompt_embeds", "AAAA", "prompt embeddings are not taken"),
    ("logits_processors", ["my.module:Proc"], "custom logits processors are not taken"),
    ("chat_template", "{{ messages }}", "start the server with --chat-template")])
def test_vllm_fields_not_served_are_refused_not_ignored(server, path, field, value, words):
    ask = {"messages": ASK} if "chat" in path else {"prompt": "hello"}
    body = {"model": "plain", "max_tokens": 2, **ask}
    resp = httpx.post(server.url + path, json={**body, field: value}, timeout=60)
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] == field and words in error["message"]
    harmless = {"use_beam_search": False, "best_of": 1}.get(field)  # asks for nothing
    resp = httpx.post(server.url + path, json={**body, field: harmless}, timeout=60)
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(server, path):
    ask = {"messages": ASK, "logprobs": True, "top_logprobs": 2} if "chat" in path else \
        {"prompt": "hello", "logprobs": 2}
    body = {"model": "plain", "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "return_tokens_as_token_ids": True, **ask}
    choice = httpx.post(server.url + path, json=body, timeout=60).json()["choices"][0]
    named = [f"token_id:{t}" for t in choice["token_ids"]]
    if "chat" in path:
        entries = choice["logprobs"]["content"]
        assert [e["token"] for e in entries] == named
        assert all(alt["token"].startswith("token_id:") for e in entries for alt in e["top_logprobs"])
    else:
        assert choice["logprobs"]["tokens"] == named
        assert all(k.startswith("token_id:") for top in choice["logprobs"]["top_logprobs"] for k in top)


def test_allowed_tokens_all_banned_is_a_400_naming_the_field(server):
    tok = server.app.state.ctx.tokenizer
    token = next(t for t in range(3, 384) if tok.encode(tok.decode([t]).lstrip(),
                                                          add_special_tokens=False) == [t])
    resp = _chat(server, allowed_token_ids=[token], bad_words=[tok.decode([token])])
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] == "allowed_token_ids", resp.text
    assert error["message"].startswith("allowed_token_ids and bad_words leave no token")
