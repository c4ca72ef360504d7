"""uvicorn's h11 protocol with a deadline on every request head (uvicorn alone waits forever
for a client that sends half a request line or header block: slowloris), and with the
refusals uvicorn answers itself (over the connection limit, an unparseable request, a head
too slow) in the same OpenAI-style JSON error body as every other refusal."""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from graft.serving.http.openai.openai_chat import APIError

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 503: b"Service Unavailable"}


def _json_error(err: APIError) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """(body, headers) of `err` as the server's other refusals carry it; the connection
    closes after it."""
    body = json.dumps(err.body()).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    return body, headers + [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]


def _raw_response(err: APIError) -> bytes:
    """A whole HTTP/1.1 response, for a connection whose request h11 never parsed."""
    body, headers = _json_error(err)
    head = b"HTTP/1.1 %d %s\r\n" % (err.status, _REASONS[err.status])
    return head + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + body


_HEAD_TIMEOUT = APIError("the request headers did not arrive in time", status=408,
                         code="request_timeout")
_BAD_REQUEST = APIError("invalid HTTP request (malformed, or its headers are over "
                        "--max-header-bytes)", code="invalid_http_request")
_OVER_LIMIT = APIError("the server is at its connection limit (--limit-concurrency); retry "
                       "shortly", status=503, type="server_error", code="over_capacity",
                       headers={"Retry-After": "1"})


class HeaderTimeoutH11Protocol(H11Protocol):
    """A client has `header_timeout_s` from connecting, or from the end of the previous
    response on a kept-alive connection, to finish sending a request's headers.

    The connection limit is this class's, not uvicorn's: uvicorn would swap in its own
    plain-text 503 app. The test is the same (this connection and the requests in flight,
    counted against --limit-concurrency), made when the request's app starts."""

    header_timeout_s = 10.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._connection_limit, self.limit_concurrency = self.limit_concurrency, None
        app = self.app

        async def limited(scope, receive, send) -> None:
            limit = self._connection_limit
            # (this request's own task is already in `tasks`, so > where uvicorn has >=)
            if limit is not None and (len(self.connections) >= limit
                                      or len(self.tasks) > limit):
                self.logger.warning("Exceeded concurrency limit.")
                body, headers = _json_error(_OVER_LIMIT)
                await send({"type": "http.response.start", "status": 503, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        self.app = limited

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            # h11 cannot answer a request it has not parsed, so the 408 is written raw
            self.transport.write(_raw_response(_HEAD_TIMEOUT))
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what h11 cannot parse, as JSON (`msg` is uvicorn's text)."""
        self.logger.debug("refused: %s", msg)
        body, headers = _json_error(_BAD_REQUEST)
        for event in (h11.Response(status_code=400, headers=headers, reason=_REASONS[400]),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a complete request head arrived: its app now runs
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        self._arm_head_timer()  # the next request on this connection gets its own deadline
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)


def with_header_timeout(seconds: float) -> type[HeaderTimeoutH11Protocol]:
    """The protocol class for uvicorn's `http=` option, with this header deadline."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,),
                {"header_timeout_s": float(seconds)})
