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
