"""OpenAI-compatible chat endpoint backend: concurrent streaming requests with retries.

Images go as base64 data URLs. TTFT is the time to the first streamed content delta.
A request that still fails after its retries becomes a Result with `error` set.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from graft.evals.backends.base import Request, Result

_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


def _content(text: str, images: list[Path]) -> str | list[dict]:
    """Split user text at <image> markers into OpenAI text / image_url parts."""
    if not images:
        return text
    pieces = text.split("<image>")
    parts: list[dict] = []
    for i, piece in enumerate(pieces):
        if piece.strip():
            parts.append({"type": "text", "text": piece.strip("\n")})
        if i < len(images) and i < len(pieces) - 1:
            mime = mimetypes.guess_type(str(images[i]))[0] or "image/png"
            data = base64.b64encode(Path(images[i]).read_bytes()).decode("ascii")
            parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
    return parts


def _retry_after(response: httpx.Response, default: float) -> float:
    """The server's Retry-After (seconds, capped at 30) when it sends one, e.g. with a 429."""
    try:
        return min(max(float(response.headers.get("retry-after", default)), 0.0), 30.0)
    except ValueError:
        return default


class EndpointBackend:
    def __init__(self, url: str, model: str | None = None, concurrency: int = 4, retries: int = 2,
                 timeout: float = 60.0, api_key: str | None = None, stream: bool = True):
        base = url.rstrip("/")
        self.url = base if base.endswith("/chat/completions") else (
            base + ("/chat/completions" if base.endswith("/v1") else "/v1/chat/completions"))
        self.concurrency, self.retries, self.timeout, self.stream = concurrency, retries, timeout, stream
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)
        self.model = model or self._first_model()
        self.identity = f"endpoint:{self.url}:{self.model}"

    def _first_model(self) -> str:
        """The served model's name from /v1/models, or "default" when the server has no list."""
        try:
            resp = self.client.get(self.url.rsplit("/chat/completions", 1)[0] + "/models")
            data = resp.json().get("data") or []
            return str(data[0]["id"]) if resp.status_code == 200 and data else "default"
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return "default"

    def _payload(self, req: Request) -> dict:
        messages = []
        for msg in req.messages:
            content = _content(msg["content"], req.images) if msg["role"] == "user" else msg["content"]
            messages.append({"role": msg["role"], "content": content})
        body = {"model": self.model, "messages": messages, "max_tokens": req.max_new_tokens,
                "temperature": req.temperature, "stream": self.stream}
        if req.temperature > 0:
            body["seed"] = req.seed
        return body

    def _once(self, body: dict) -> Result:
        start = time.perf_counter()
        if not self.stream:
            resp = self.client.post(self.url, json=body)
            resp.raise_for_status()
            text = resp.json()["choices"][0]["message"]["content"]
            return Result(text.strip(), latency=time.perf_counter() - start)
        ttft, chunks = None, []
        with self.client.stream("POST", self.url, json=body) as resp:
            if resp.status_code >= 400:
                resp.read()
                resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"server error in stream: {event['error']}")
                delta = (event.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
                if delta and ttft is None:
                    ttft = time.perf_counter() - start
                chunks.append(delta)
        return Result("".join(chunks).strip(), latency=time.perf_counter() - start, ttft=ttft)

    def _send(self, req: Request) -> Result:
        body = self._payload(req)
        error, wait = "", 0.0
        for attempt in range(self.retries + 1):
            wait = min(0.25 * 2**attempt, 4.0)
            try:
                return self._once(body)
            except httpx.HTTPStatusError as err:
                error = f"HTTP {err.response.status_code}: {err.response.text[:200]}"
                if err.response.status_code not in _RETRY_STATUS:
                    break
                wait = _retry_after(err.response, wait)
            except httpx.TimeoutException:
                error = f"timed out after {self.timeout:g}s"
            except (httpx.HTTPError, ValueError, KeyError, IndexError, RuntimeError) as err:
                error = f"{type(err).__name__}: {err}"
            if attempt < self.retries:
                time.sleep(wait)
        return Result(None, error=f"{error} (after {attempt + 1} attempt(s))")

    def generate(self, requests: list[Request]) -> list[Result]:
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            return list(pool.map(self._send, requests))

    def close(self) -> None:
        self.client.close()
