"""`vllm serve` on an exported graft answers the official openai client with images, streaming
and not, with graft's engine's greedy tokens (the server is started once for the module)."""

from __future__ import annotations

import base64
import io

import pytest

from tests.serving.vllm_plugin.conftest import graft_engine, image, serve_command, vllm_env

MAX_TOKENS = 8


def _data_url(im) -> str:
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server(vllm_python, vllm_export, tmp_path_factory):
    from graft.benchmarks.peers_serve import free_port
    from graft.benchmarks.peers_serve import server as started

    run, export = vllm_export("llama", "siglip")
    port = free_port()
    log = tmp_path_factory.mktemp("vllm_serve") / "serve.log"
    cmd = serve_command(vllm_python, export, port, "--seed", "0")
    # a server that exits or never answers /health fails the module's tests with its log's path
    with started(cmd, vllm_env(), port, log, "vllm serve") as url:
        yield f"{url}/v1", run


# (graft messages with <image> markers, the same turn as OpenAI content parts, image sizes)
CASES = {
    "one-image": ("<image>\nWhat is shown in the image?",
                  [("image", 0), ("text", "What is shown in the image?")], [(50, 40)]),
    "two-images": ("<image>\n<image>\nWhich one is brighter?",
                   [("image", 0), ("image", 1), ("text", "Which one is brighter?")],
                   [(23, 37), (300, 200)]),
    # parts in the order sent, joined with "\n" (as graft's server does): the export's chat
    # template takes content parts, so vLLM passes them through rather than moving images first
    "text-between-images": ("Compare\n<image>\nwith\n<image>",
                            [("text", "Compare"), ("image", 0), ("text", "with"), ("image", 1)],
                            [(64, 64), (50, 40)]),
}


def _openai_messages(parts, images):
    content = [{"type": "image_url", "image_url": {"url": _data_url(images[v])}} if kind == "image"
               else {"type": "text", "text": v} for kind, v in parts]
    return [{"role": "user", "content": content}]


def _graft_tokens(run, text, images) -> list[int]:
    from graft.serving import SamplingParams
    from graft.serving.multimodal.front import generate_chats

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    done = generate_chats(graft_engine(run), {"r": ([{"role": "user", "content": text}], images)},
                          params)
    return done["r"].token_ids


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_openai_client_gets_graft_tokens(server, case):
    from openai import OpenAI

    base_url, run = server
    text, parts, sizes = CASES[case]
    images = [image(40 + i, s) for i, s in enumerate(sizes)]
    want = _graft_tokens(run, text, images)
    client = OpenAI(base_url=base_url, api_key="unused")
    extra = {"ignore_eos": True, "return_token_ids": True}
    messages = _openai_messages(parts, images)

    reply = client.chat.completions.create(model="graft", messages=messages, temperature=0,
                                           max_tokens=MAX_TOKENS, extra_body=extra)
    assert reply.choices[0].token_ids == want
    assert reply.usage.completion_tokens == MAX_TOKENS

    stream = client.chat.completions.create(model="graft", messages=messages, temperature=0,
                                            max_tokens=MAX_TOKENS, extra_body=extra, stream=True)
    streamed, text_parts = [], []
    for chunk in stream:
        for choice in chunk.choices:
            streamed += getattr(choice, "token_ids", None) or []
            text_parts.append(choice.delta.content or "")
    assert streamed == want
    assert "".join(text_parts) == reply.choices[0].message.content
