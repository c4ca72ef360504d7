"""Prompt logprobs over HTTP: /v1/completions `echo` with `logprobs` (OpenAI's legacy way to
score a text, what lm-evaluation-harness's loglikelihood requests send) and vLLM's
`prompt_logprobs` on completions and chat, equal to HF transformers on the same ids."""

import httpx
import openai
import pytest

from tests.serving.engine.test_prompt_logprobs import hf_prompt_logprobs, rank_bounds

PROMPT = "The quick brown fox jumps over"


@pytest.fixture(scope="module")
def client(plain_server):
    return openai.OpenAI(base_url=plain_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def prompt_ids(plain_server):
    return plain_server.app.state.ctx.tokenizer(PROMPT, add_special_tokens=True)["input_ids"]


def create(client, **fields):
    fields.setdefault("prompt", PROMPT)
    fields.setdefault("max_tokens", 3)
    extra = {"ignore_eos": True, **fields.pop("extra", {})}
    return client.completions.create(model="plain", temperature=0, extra_body=extra, **fields)


def test_echo_with_logprobs_scores_the_prompt_as_hf(client, plain_server, prompt_ids,
                                                     tiny_llama_2k):
    decode = plain_server.app.state.ctx.tokenizer.decode
    ref = hf_prompt_logprobs(tiny_llama_2k, prompt_ids)
    plain = create(client, logprobs=2).choices[0]
    echoed = create(client, logprobs=2, echo=True).choices[0]
    lp, n = echoed.logprobs, len(prompt_ids)
    assert echoed.text == PROMPT + plain.text
    assert lp.tokens == [decode([t]) for t in prompt_ids] + plain.logprobs.tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for p in range(1, n):
        assert lp.token_logprobs[p] == pytest.approx(float(ref[p - 1][prompt_ids[p]]), abs=2e-4)
        assert 1 <= len(lp.top_logprobs[p]) <= 2  # keyed by text: byte tokens may share one
    # the answer's (its first row's logits came from a bigger lm_head call: rounding)
    assert lp.token_logprobs[n:] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[n:] == [len(PROMPT) + o for o in plain.logprobs.text_offset]

    chunks = list(create(client, logprobs=2, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == echoed.text
    streamed = [x for c in chunks if c.choices[0].logprobs for x in zip(
        c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs,
        c.choices[0].logprobs.text_offset)]
    assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset))


def test_vllm_prompt_logprobs_on_completions(client, prompt_ids, tiny_llama_2k):
    ref = hf_prompt_logprobs(tiny_llama_2k, prompt_ids)
    for _ in range(2):  # the second is a prefix-cache candidate: still every position scored
        reply = create(client, extra={"prompt_logprobs": 3})
        scored = reply.choices[0].model_extra["prompt_logprobs"]
        assert reply.usage.prompt_tokens_details.cached_tokens == 0
        assert len(scored) == len(prompt_ids) and scored[0] is None
        for p in range(1, len(prompt_ids)):
            own = scored[p][str(prompt_ids[p])]
            assert own["logprob"] == pytest.approx(float(ref[p - 1][prompt_ids[p]]), abs=2e-4)
            low, high = rank_bounds(ref[p - 1], own["logprob"])
            assert low <= own["rank"] <= high
            top = sorted((v["rank"], int(k)) for k, v in scored[p].items()
                         if int(k) != prompt_ids[p] or v["rank"] <= 3)
            assert [r for r, _ in top][:3] == [1, 2, 3]
            assert all(isinstance(v["decoded_token"], str) for v in scored[p].values())
    assert "prompt_logprobs" not in create(client).choices[0].model_extra


def test_vllm_prompt_logprobs_on_chat(plain_server):
    body = {"model": "plain", "max_tokens": 2, "temperature": 0, "prompt_logprobs": 0,
            "messages": [{"role": "user", "content": "Name a color."}]}
    reply = httpx.post(plain_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    scored = reply["prompt_logprobs"]
    assert len(scored) == reply["usage"]["prompt_tokens"] and scored[0] is None
    assert all(len(entry) == 1 and next(iter(entry.values()))["logprob"] <= 0
               for entry in scored[1:])


def test_a_chat_of_n_samples_scores_its_prompt_once(plain_server, monkeypatch):
    """n = 3 with prompt_logprobs: the first sample scores the prompt, the others do not (the
    answer has one prompt_logprobs); completions keep it in every choice."""
    worker, asked = plain_server.app.state.ctx.worker, []
    submit = worker.submit
    monkeypatch.setattr(worker, "submit", lambda job, *a: asked.append(
        job.sampling_params.prompt_logprobs) or submit(job, *a))
    body = {"model": "plain", "max_tokens": 2, "temperature": 0, "prompt_logprobs": 1, "n": 3,
            "messages": [{"role": "user", "content": "Name a color."}]}
    reply = httpx.post(plain_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    assert asked == [1, None, None] and len(reply["choices"]) == 3
    assert len(reply["prompt_logprobs"]) == reply["usage"]["prompt_tokens"]
    asked.clear()
    reply = httpx.post(plain_server.url + "/v1/completions", timeout=60, json={
        "model": "plain", "max_tokens": 2, "prompt": PROMPT, "prompt_logprobs": 1, "n": 2}).json()
    assert asked == [1, 1] and all(c["prompt_logprobs"] for c in reply["choices"])


@pytest.mark.parametrize("path,fields", [
    ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 1, "stream": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "prompt_logprobs": 1, "stream": True}),
    ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 21}),
    ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": -1}),
])
def test_bad_prompt_logprobs_are_400s_naming_the_field(plain_server, path, fields):
    reply = httpx.post(plain_server.url + path, json={"model": "plain", **fields}, timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "prompt_logprobs" and "\n" not in error["message"]


def test_an_image_prompt_scores_its_text_only(live_server):
    from PIL import Image

    from graft.serving.multimodal.media import to_data_url

    url = to_data_url(Image.new("RGB", (32, 32), (220, 20, 20)))
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0, "prompt_logprobs": 1,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "What color?"}]}]}
    reply = httpx.post(live_server.url + "/v1/chat/completions", json=body, timeout=60).json()
    scored = reply["prompt_logprobs"]
    assert len(scored) == reply["usage"]["prompt_tokens"]
    # the 16 image positions are no tokens: None, as the first; every text token is scored
    assert sum(entry is None for entry in scored) == 1 + 16
    assert all(entry is None or len(entry) in (1, 2) for entry in scored)
