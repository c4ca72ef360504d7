"""What a web page in the user's browser must not be able to do to a local server: post to it
(a form or `fetch` with `text/plain` needs no CORS preflight, so bodies must be JSON: 415) and
read its answers through DNS rebinding (a name the attacker controls, re-pointed at
127.0.0.1, arrives with the attacker's name in `Host`: 421 unless the Host is allowed).
An ASGI middleware, so it runs before routing, auth and any body is read."""

from __future__ import annotations

import ipaddress

from graft.serving.http.openai.openai_chat import APIError
from graft.serving.http.openai.responses import error_response

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_BODY_METHODS = {"POST", "PUT", "PATCH"}


def is_loopback(host: str) -> bool:
    """Whether binding to `host` serves this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_host_names(host: str, api_keys, extra: list[str]) -> tuple[str, ...]:
    """The host names (any port) whose Host headers the server answers: () means any. Bound
    to loopback without a key: the loopback names, plus `extra` (--allowed-host); `extra`
    given, those names on any bind. Any port, because a port forward (ssh -L, docker -p)
    changes it, while a rebinding page can only send its own name."""
    names = [name.lower().rstrip(".") for name in extra]
    if is_loopback(host) and not api_keys:
        names += [*LOOPBACK_NAMES, (f"[{host}]" if ":" in host else host).lower()]
    return tuple(dict.fromkeys(names))


def host_name(header: str) -> str:
    """'LocalHost:8000' -> 'localhost', '[::1]:8000' -> '[::1]' (the port dropped)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[:header.find("]") + 1]
    name, _, port = header.rpartition(":")
    return name.rstrip(".") if name and port.isdigit() else header.rstrip(".")


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


class RequestGuard:
    """ASGI middleware: the size of the request head (when `max_header_bytes` is set), the
    Host allow-list (when `allowed_hosts` is not empty), then JSON-only request bodies.
    `on_refused()` counts each refusal."""

    def __init__(self, app, allowed_hosts: tuple[str, ...], on_refused=lambda: None,
                 max_header_bytes: int | None = None):
        """`allowed_hosts`: host names (allowed_host_names), empty: any."""
        self.app = app
        self.allowed = frozenset(allowed_hosts)
        self.on_refused = on_refused
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                self.on_refused()
                return await error_response(refusal)(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, scope) -> APIError | None:
        if self.max_header_bytes is not None:
            # as sent: "METHOD target HTTP/1.1", then "name: value" lines, each with its CRLF
            size = (len(scope["method"]) + len(scope.get("raw_path") or b"")
                    + len(scope.get("query_string") or b"") + 12
                    + sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ())))
            if size > self.max_header_bytes:
                return APIError(f"the request line and headers are {size} bytes, over this "
                                f"server's {self.max_header_bytes} (--max-header-bytes); send "
                                "fewer or shorter headers", status=431, param=None,
                                code="headers_too_large", headers={"Connection": "close"})
        headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                   for k, v in scope.get("headers", ())}
        host = headers.get("host", "")
        if self.allowed and host_name(host) not in self.allowed:
            return APIError(f"Host {host[:100]!r} is not served here; this server answers only "
                            "requests addressed to its own name (start it with --allowed-host "
                            "NAME to add one)", status=421, param="Host", code="host_not_allowed",
                            headers={"Connection": "close"})
        if scope["method"] in _BODY_METHODS and not _is_json(headers.get("content-type", "")):
            given = headers.get("content-type") or "none"
            return APIError(f"request bodies must be JSON; send 'Content-Type: application/json' "
                            f"(got {given[:100]!r})", status=415, param="Content-Type",
                            code="unsupported_media_type", headers={"Connection": "close"})
        return None
