"""Shared by the eval tests: an endpoint URL nobody answers, so every request fails for real
(ConnectError, no retries) and a run writes its files in a second without loading a model."""

import socket

import pytest


@pytest.fixture
def dead_url():
    with socket.socket() as s:  # a port nobody listens on once this closes
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def failed_run(dead_url):
    """failed_run(out_dir, **run_eval options): example_pope's first 4 questions, all failed."""
    from graft.evals import run_eval

    def run(out_dir, **options):
        kwargs = dict(tasks=["example_pope"], limit=4, cache=False, n_boot=20, log=None,
                      retries=0, timeout=2, model="m")
        return run_eval(dead_url, out_dir=out_dir, **{**kwargs, **options})
    return run
