"""The endpoint backend against a local FastAPI server (127.0.0.1 only) that fails on purpose."""

import asyncio
import json
import threading
import time

import pytest

from graft.evals import run_eval
from graft.evals.backends.endpoint import EndpointBackend


def _make_app(seen: dict):
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "tiny-graft", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        content = body["messages"][-1]["content"]
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        text = " ".join(p["text"] for p in parts if p["type"] == "text")
        seen.setdefault(text, 0)
        seen[text] += 1
        seen["images"] = seen.get("images", 0) + sum(p["type"] == "image_url" for p in parts)
        seen["model"] = body["model"]
        if "fail" in text:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if "bad" in text:
            return JSONResponse({"error": {"message": "bad request", "type": "invalid_request_error"}}, status_code=400)
        if "busy" in text and seen[text] == 1:  # refused once, as an admission controller would
            return JSONResponse({"error": {"message": "busy"}}, status_code=429, headers={"Retry-After": "0"})
        if "slow" in text:
            await asyncio.sleep(1.5)

        async def events():
            for piece in ("ye", "s"):
                chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture
def server():
    import uvicorn

    seen: dict = {}
    config = uvicorn.Config(_make_app(seen), host="127.0.0.1", port=0, log_level="error")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert time.monotonic() < deadline, "local test server did not start"
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", seen
    srv.should_exit = True
    thread.join(timeout=10)


def test_failing_requests_are_recorded_not_fatal(server, tmp_path):
    url, seen = server
    from PIL import Image

    Image.new("RGB", (4, 4), (255, 0, 0)).save(tmp_path / "img.png")
    rows = [{"id": "ok", "question": "ok?", "answer": "yes", "image": "img.png"},
            {"id": "fail", "question": "fail?", "answer": "yes"},
            {"id": "bad", "question": "bad?", "answer": "yes"},
            {"id": "slow", "question": "slow?", "answer": "yes"},
            {"id": "ok2", "question": "fine?", "answer": "yes"},
            {"id": "busy", "question": "busy?", "answer": "yes"}]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "t.yaml").write_text("name: probe\ndata: q.jsonl\ndata_root: .\nmetrics: [exact_match]\n")

    results = run_eval(url + "/v1", tasks=[str(tmp_path / "t.yaml")], out_dir=tmp_path / "out", cache=False,
                       n_boot=20, log=None, retries=1, timeout=0.5, concurrency=3)
    task = results["tasks"]["probe"]
    assert task["n"] == 6 and task["n_errors"] == 3 and task["accuracy"] == pytest.approx(3 / 6)
    samples = {json.loads(x)["id"]: json.loads(x) for x in (tmp_path / "out" / "samples_probe.jsonl").read_text().splitlines()}
    assert samples["ok"]["prediction"] == "yes" and samples["ok"]["ttft"] is not None
    assert samples["ok"]["latency"] >= samples["ok"]["ttft"]
    assert "HTTP 500" in samples["fail"]["error"] and "2 attempt" in samples["fail"]["error"]
    assert "HTTP 400" in samples["bad"]["error"] and "1 attempt" in samples["bad"]["error"]
    assert "timed out" in samples["slow"]["error"]
    assert seen["fail?"] == 2 and seen["bad?"] == 1  # 5xx retried once, 4xx not retried
    assert samples["busy"]["prediction"] == "yes" and seen["busy?"] == 2  # 429 retried after Retry-After
    assert seen["images"] == 1 and seen["model"] == "tiny-graft"
    assert results["config"]["backend"] == "endpoint"


def test_unreachable_endpoint_is_recorded(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = EndpointBackend(f"http://127.0.0.1:{port}", model="m", retries=0, timeout=2)
    from graft.evals.backends.base import Request

    [res] = backend.generate([Request([{"role": "user", "content": "hi"}])])
    assert res.prediction is None and "ConnectError" in res.error
