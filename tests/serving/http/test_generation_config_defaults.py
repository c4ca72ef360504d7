"""`graft serve --generation-config` (vLLM's flag and default, auto): the fields a request
leaves unset take the model's generation_config.json sampling values (here top_k 1, so
greedy, and max_new_tokens 3); `vllm` keeps OpenAI's defaults; a folder is read instead."""

import argparse
import json
import shutil

import httpx
import pytest

from graft.errors import GraftConfigError
from graft.serving.http import serve_cli
from tests.serving.http.conftest import LiveServer

ASK = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def sampled_llm(tiny_llama, tmp_path_factory):
    """The tiny Llama whose generation_config.json recommends top_k 1 and 3 new tokens."""
    llm = tmp_path_factory.mktemp("gen_cfg") / "llm"
    shutil.copytree(tiny_llama, llm)
    config = json.loads((llm / "generation_config.json").read_text())
    config.update(do_sample=True, temperature=0.7, top_k=1, max_new_tokens=3)
    (llm / "generation_config.json").write_text(json.dumps(config))
    return llm


def _build(llm, *extra):
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return serve_cli.build(parser.parse_args([str(llm), "--served-model-name", "plain",
                                              "--num-kv-blocks", "32", "--max-model-len", "64",
                                              *extra]))


def _chat(server, **fields) -> dict:
    body = {"model": "plain", "messages": ASK, "ignore_eos": True, "return_token_ids": True,
            **fields}
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


def test_unset_fields_take_the_models_defaults(sampled_llm):
    with LiveServer(_build(sampled_llm)) as server:
        assert server.app.state.ctx.settings.sampling_defaults == {
            "temperature": 0.7, "top_k": 1, "max_tokens": 3}
        greedy = _chat(server, temperature=0, max_tokens=3)["token_ids"]
        for seed in (1, 2):  # top_k 1 from the model: every sample is the greedy answer
            assert _chat(server, seed=seed)["token_ids"] == greedy
        assert len(_chat(server, max_tokens=5)["token_ids"]) == 5  # what a request sets wins


def test_vllm_keeps_openais_defaults_and_a_folder_is_read(sampled_llm, tiny_llama, tmp_path):
    with LiveServer(_build(sampled_llm, "--generation-config", "vllm")) as server:
        assert server.app.state.ctx.settings.sampling_defaults == {}
        assert len(_chat(server, seed=1)["token_ids"]) > 3  # all the room the context leaves
    with LiveServer(_build(tiny_llama, "--generation-config", str(sampled_llm))) as server:
        assert server.app.state.ctx.settings.sampling_defaults["max_tokens"] == 3
    with pytest.raises(GraftConfigError, match="--generation-config .*: no generation_config.json"):
        _build(tiny_llama, "--generation-config", str(tmp_path))
