"""A request goes one way from HTTP to the engine: route (routes/v1.py) -> chat_request.py
(parse with openai_chat.py, validate, SamplingParams, submit) -> engine_worker.py. No module
on that path imports one before it, so a parameter cannot bounce back (as max_tokens did:
server -> context -> protocol -> context -> server)."""

import ast

from tests.test_import_graph import _imports, _modules

PATH = ["graft.serving.http.server", "graft.serving.http.routes.v1",
        "graft.serving.http.openai.chat_request", "graft.serving.http.engine_worker"]
WIRE = "graft.serving.http.openai.openai_chat"  # the request/response shapes every step reads


def test_each_step_imports_only_the_steps_after_it():
    mods = _modules()
    for k, name in enumerate(PATH):
        found = _imports(ast.parse(mods[name].read_text()), mods)
        assert not found & set(PATH[:k]), f"{name} imports an earlier step"
    assert not _imports(ast.parse(mods[WIRE].read_text()), mods) & set(PATH)
    assert "graft.serving.http.openai.chat_request" in _imports(
        ast.parse(mods["graft.serving.http.routes.v1"].read_text()), mods)


def test_build_app_is_wiring_only():
    """The routes live in serving/http/routes; build_app only includes them."""
    import inspect

    from graft.serving.http.server import build_app

    source = inspect.getsource(build_app)
    assert len(source.splitlines()) < 40 and "@app.get" not in source and "@app.post" not in source
