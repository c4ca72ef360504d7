"""uvicorn's h11 protocol with a deadline on every request head: uvicorn alone waits forever
for a client that sends half a request line or header block (slowloris)."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                     b"content-length: 0\r\nconnection: close\r\n\r\n")


class HeaderTimeoutH11Protocol(H11Protocol):
    """A client has `header_timeout_s` from connecting, or from the end of the previous
    response on a kept-alive connection, to finish sending a request's headers."""

    header_timeout_s = 10.0

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
            self.transport.write(_TIMEOUT_RESPONSE)
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
