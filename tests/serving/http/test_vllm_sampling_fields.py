"""vLLM's sampling fields on chat and text completions: stop_token_ids (the answer ends at the
first, its text left out), include_stop_str_in_output (the stop string kept) and
skip_special_tokens; the answers are the engine's for the same SamplingParams."""

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


@pytest.mark.parametrize("ids", [[-1], [10 ** 6], ["7"]])
def test_bad_stop_token_ids_are_400s_naming_the_field(server, ids):
    resp = _chat(server, stop_token_ids=ids)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"].startswith("stop_token_ids"), resp.text
