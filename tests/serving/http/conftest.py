"""A real uvicorn server on 127.0.0.1 (random free port) around a tiny run dir."""

import socket
import threading
import time

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, app, **uvicorn_options):
        import uvicorn

        self.app = app
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on",
                                                    **uvicorn_options))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        for _ in range(600):  # until it accepts connections (no timing assertion)
            if self.server.started:
                return self
            time.sleep(0.05)
        raise RuntimeError("uvicorn did not start")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


def settled(server, timeout=10.0):
    """Wait until the server's engine worker holds no request; its KV blocks in use then."""
    ctx = server.app.state.ctx
    end = time.monotonic() + timeout
    while (ctx.worker.active or ctx.worker.pending) and time.monotonic() < end:
        time.sleep(0.01)
    assert not ctx.worker.active and not ctx.worker.pending
    return ctx.engine.kv_usage()[0]


def serve_app(*argv: str):
    """The app `graft serve ARGV` serves, built as the CLI builds it (not started)."""
    import argparse

    from graft.serving.http import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return serve_cli.build(parser.parse_args(list(argv)))


@pytest.fixture(scope="module")
def live_server(tiny_run_dir, tmp_path_factory):  # noqa: F811
    import argparse

    from graft.serving.http import serve_cli

    media = tmp_path_factory.mktemp("media")
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args([str(tiny_run_dir), "--served-model-name", "tiny",
                              "--allowed-local-media-path", str(media),
                              "--limit-images-per-prompt", "2", "--max-image-pixels", "4096",
                              "--max-image-bytes", "3000",
                              "--max-model-len", "256", "--num-kv-blocks", "64",
                              "--max-num-batched-tokens", "64"])
    app = serve_cli.build(args)
    with LiveServer(app) as server:
        server.media_dir = media
        yield server


@pytest.fixture(scope="session")
def tiny_llama_2k(tmp_path_factory):
    """The tiny Llama with a 2048-token context (a tool prompt alone is ~500 of its tokens)."""
    from tests.tiny_llm import build_llm

    return build_llm(tmp_path_factory.mktemp("llm_llama_2k"), "llama",
                     config_overrides={"max_position_embeddings": 2048})


@pytest.fixture(scope="module")
def plain_server(tiny_llama_2k):
    """`graft serve LLM_DIR` (text only) as model "plain", on the 2k-context tiny Llama."""
    from graft.serving import Engine, EngineConfig
    from graft.serving.http.server import ServerSettings, build_app

    engine = Engine.from_pretrained(tiny_llama_2k, EngineConfig(num_kv_blocks=192))
    with LiveServer(build_app(engine, ServerSettings(model_name="plain"))) as server:
        yield server
