"""`graft serve --graft a=RUN --graft b=RUN` over real HTTP: the model field picks the graft,
/v1/models lists every graft and the bare LLM, per-graft metrics; bad --graft use refused."""

import argparse

import httpx
import pytest
from PIL import Image

from graft.errors import GraftConfigError, GraftError
from graft.serving.http import serve_cli
from graft.serving.multimodal.media import to_data_url
from tests.serving.http.conftest import LiveServer

RED = Image.new("RGB", (32, 32), (220, 20, 20))


def _args(argv):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser.parse_args(argv + ["--max-model-len", "256", "--num-kv-blocks", "64",
                                     "--max-num-batched-tokens", "64"])


def _msgs(image=RED, text="What color?"):
    content = [{"type": "text", "text": text}]
    if image is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": to_data_url(image)}})
    return [{"role": "user", "content": content}]


@pytest.fixture(scope="module")
def server(graft_runs):
    app = serve_cli.build(_args(["--graft", f"sig={graft_runs['sig']}",
                                 "--graft", f"clip={graft_runs['clip']}",
                                 "--served-model-name", "base"]))
    with LiveServer(app) as live:
        yield live


def _chat(server, model, **body):
    body = {"model": model, "messages": _msgs(), "max_tokens": 5, "temperature": 0, **body}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def test_models_lists_grafts_and_bare_llm(server, graft_runs):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["base", "sig", "clip"]
    # vLLM's fields: the dir each entry serves, no parent, the context length
    listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
    ctx = server.app.state.ctx
    assert [listed[k]["root"] for k in ("base", "sig", "clip")] == \
        [str(ctx.engine.model_dir), str(graft_runs["sig"]), str(graft_runs["clip"])]
    assert {(m["parent"], m["max_model_len"]) for m in listed.values()} == {(None, 256)}
    sig = client.chat.completions.create(model="sig", messages=_msgs(), max_tokens=5, temperature=0)
    clip = client.chat.completions.create(model="clip", messages=_msgs(), max_tokens=5,
                                          temperature=0)
    assert sig.model == "sig" and clip.model == "clip"
    assert sig.usage.prompt_tokens == clip.usage.prompt_tokens  # same LLM, same image size


def test_model_field_picks_the_graft(server, graft_runs):
    from graft.serving import Engine, EngineConfig, SamplingParams

    got = _chat(server, "clip", max_tokens=6, ignore_eos=True).json()["choices"][0]["message"]
    alone = Engine.from_pretrained(graft_runs["clip"], EngineConfig(num_kv_blocks=64))
    ids, mm = alone.mm.prepare_chat([{"role": "user", "content": "<image>\nWhat color?"}], [RED])
    alone.add_request("x", prompt_token_ids=ids, mm_inputs=mm,
                      sampling_params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    final = None
    while alone.has_unfinished_requests():
        final = next((o for o in alone.step() if o.finished), final)
    assert got["content"] == final.text


def test_bare_llm_is_text_only_and_unknown_models_404(server):
    text = _chat(server, "base", messages=_msgs(image=None))
    assert text.status_code == 200
    r = _chat(server, "base")
    assert r.status_code == 400 and r.json()["error"]["code"] == "images_not_supported"
    r = _chat(server, "nope")
    assert r.status_code == 404 and "'sig'" in r.json()["error"]["message"]


def test_per_graft_metrics(server):
    for _ in range(2):  # the second is an encoder-cache hit
        assert _chat(server, "sig", messages=_msgs(text="Again?")).status_code == 200
    text = httpx.get(server.url + "/metrics").text
    lines = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(lines['graft_per_graft_requests_total{graft="sig"}']) >= 2
    assert float(lines['graft_per_graft_time_to_first_token_seconds_count{graft="sig"}']) >= 2
    assert float(lines['graft_per_graft_encoder_cache_hits{graft="sig"}']) >= 1
    assert 0 < float(lines['graft_per_graft_encoder_cache_hit_rate{graft="sig"}']) < 1
    assert 'graft_per_graft_requests_total{graft="base"}' in lines
    assert 'graft_per_graft_encoder_cache_hits{graft="base"}' not in lines  # no encoder


def test_bad_graft_arguments(graft_runs, tiny_llama):
    with pytest.raises(GraftConfigError, match="NAME=RUN_DIR"):
        serve_cli.build(_args(["--graft", str(graft_runs["sig"])]))
    with pytest.raises(GraftConfigError, match="used twice"):
        serve_cli.build(_args(["--graft", f"a={graft_runs['sig']}",
                               "--graft", f"a={graft_runs['clip']}"]))
    with pytest.raises(GraftConfigError, match="is a run dir"):
        serve_cli.build(_args([str(graft_runs["clip"]), "--graft", f"a={graft_runs['sig']}"]))
    with pytest.raises(GraftConfigError, match="PATH"):
        serve_cli.build(_args([]))
    with pytest.raises(GraftConfigError, match="not a run dir"):
        serve_cli.build(_args(["--graft", f"a={tiny_llama}"]))
    with pytest.raises(GraftError, match="names both the bare LLM and a graft"):
        serve_cli.build(_args(["--graft", f"sig={graft_runs['sig']}", "--served-model-name", "sig"]))
