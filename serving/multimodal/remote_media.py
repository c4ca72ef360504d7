"""Fetching http(s) image URLs without letting a client reach the server's own network.

Every hop's host is resolved and each of its addresses must be public (no loopback,
private, link-local, multicast or reserved space, IPv4 or IPv6, also when embedded in an
IPv6 address); the connection goes to the address that was checked (no second lookup to
rebind), redirects are followed by hand so each target is checked, and the whole fetch has
one deadline (connect, response headers and body of every hop: a host trickling its headers
is cut off like one trickling its body) and a byte cap. Every refused or failed fetch gets the same message, so
errors cannot be used to probe which internal hosts or ports exist.

Requests that fetch remote images are prepared on a pool of their own (`RemoteFetchPool`),
bounded in threads, so slow hosts hold only its threads, never the pool that local images
and text use; each request has one deadline for all its fetches, counted from when it was
queued, so a request that waited in the queue gets only what is left of it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from urllib.parse import urljoin, urlsplit

from graft.errors import RequestError

log = logging.getLogger("graft.serving")

_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # IPv4 addresses embedded by NAT64 gateways
REMOTE_FETCH_WORKERS = 8  # requests fetching remote images at once; more wait in the queue
_request = threading.local()  # .deadline: the request this thread prepares (RemoteFetchPool)


class RemoteFetchPool(Executor):
    """A bounded pool for preparing requests that fetch remote images. Each submitted call
    gets a deadline of `media.remote_timeout_s` (a MediaConfig's, read at submission) from
    submission, which every `fetch_remote` it makes shares (time in the queue counts: the
    request's total stays within it)."""

    def __init__(self, media, workers: int = REMOTE_FETCH_WORKERS):
        self.media = media
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graft-remote-media")

    def submit(self, fn, /, *args, **kwargs) -> Future:
        deadline = time.monotonic() + self.media.remote_timeout_s
        return self._pool.submit(_with_deadline, deadline, fn, args, kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def _with_deadline(deadline: float, fn, args, kwargs):
    _request.deadline = deadline
    try:
        return fn(*args, **kwargs)
    finally:
        _request.deadline = None


class _Refused(Exception):
    """Why a fetch was refused (for the server log; clients get one message for all)."""


def is_public_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a server may connect to `ip` on a client's behalf."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = [ip.ipv4_mapped, ip.sixtofour, *(ip.teredo or ())]
        if ip in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if any(v4 is not None and not is_public_address(v4) for v4 in embedded):
            return False
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_private
                                 or ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def resolve(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Every address `host` resolves to (one module function, so tests can stand in for DNS)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def http_client(timeout_s: float):
    """The (async) client fetches go through: no redirects followed for us, no proxies from
    the environment (a proxy would connect to a name we never checked)."""
    import httpx

    return httpx.AsyncClient(follow_redirects=False, trust_env=False, timeout=timeout_s)


def domain_allowed(host: str, domains: tuple[str, ...]) -> bool:
    """`host` is one of `domains` or a subdomain of one (no domains: any host)."""
    host = host.lower().rstrip(".")
    return not domains or any(host == d or host.endswith("." + d)
                              for d in (d.lower().strip(".") for d in domains))


def _target(url: str, domains: tuple[str, ...]) -> tuple[str, str, str]:
    """(URL to request at a checked address, Host header, TLS server name) for one hop."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Refused(f"not an http(s) URL with a host: {url[:80]!r}")
    if parts.username is not None or parts.password is not None:
        raise _Refused("credentials in the URL")
    host = parts.hostname
    if not domain_allowed(host, domains):
        raise _Refused(f"host {host!r} is not under --allowed-media-domains")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        addrs = resolve(host, port)
    except (OSError, ValueError, UnicodeError) as err:
        raise _Refused(f"cannot resolve {host!r}: {err}") from None
    bad = [str(a) for a in addrs if not is_public_address(a)]
    if not addrs or bad:  # one private record is enough to refuse (rebinding tricks)
        raise _Refused(f"host {host!r} resolves to non-public address(es) {bad}")
    ip = addrs[0]
    netloc = f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return parts._replace(netloc=netloc).geturl(), host_header, host


def fetch_remote(url: str, max_bytes: int, timeout_s: float, max_redirects: int,
                 domains: tuple[str, ...], param: str) -> bytes:
    """The body of a public http(s) URL (after at most `max_redirects` checked redirects),
    within `timeout_s` in total (less, on a RemoteFetchPool thread: what is left of the
    request's deadline) and `max_bytes`; RequestError otherwise. Blocking: call it from a
    worker thread (it runs its own event loop, so that the one deadline can cancel the fetch
    wherever it waits; httpx's own timeouts are per read)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    deadline = min(deadline, getattr(_request, "deadline", None) or deadline)
    try:
        left = deadline - time.monotonic()
        if left <= 0:
            raise asyncio.TimeoutError  # queued past the request's deadline: no connection
        return asyncio.run(asyncio.wait_for(
            _fetch(url, max_bytes, max_redirects, domains, param, deadline), left))
    except _Refused as why:
        log.info("refused image fetch %.120r: %s", url, why)
    except asyncio.TimeoutError:
        log.info("image fetch %.120r: no complete answer within %g s", url, timeout_s)
    except httpx.HTTPError as err:
        log.info("image fetch %.120r failed: %s", url, err)
    raise RequestError(f"the image URL could not be fetched; it must be a public http(s) URL "
                       f"that answers with the image within {timeout_s:g} s", param=param,
                       code="image_fetch_failed") from None


async def _fetch(url: str, max_bytes: int, max_redirects: int, domains: tuple[str, ...],
                 param: str, deadline: float) -> bytes:
    for _ in range(max_redirects + 1):
        body, location = await _hop(url, domains, deadline, max_bytes, param)
        if body is not None:
            return body
        url = urljoin(url, location)
    raise _Refused(f"more than {max_redirects} redirects")


async def _hop(url: str, domains: tuple[str, ...], deadline: float, max_bytes: int,
               param: str) -> tuple[bytes | None, str | None]:
    """One checked request: (body, None) or (None, redirect location). A client per hop, so
    no connection (nor its TLS name) carries over to another host."""
    target, host_header, server_name = _target(url, domains)
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Refused("deadline passed")
    async with http_client(left) as client:
        request = client.build_request(  # TLS checks the name, not the address
            "GET", target, headers={"Host": host_header}, extensions={"sni_hostname": server_name})
        resp = await client.send(request, stream=True)
        try:
            if resp.is_redirect and "location" in resp.headers:
                return None, resp.headers["location"]
            if resp.status_code != 200:
                raise _Refused(f"HTTP {resp.status_code}")
            return await _read_capped(resp, max_bytes, param), None
        finally:
            await resp.aclose()


async def _read_capped(resp, max_bytes: int, param: str) -> bytes:
    buf = bytearray()
    async for chunk in resp.aiter_bytes():
        buf += chunk
        if len(buf) > max_bytes:
            raise RequestError(f"image is over the limit of {max_bytes} bytes; send a smaller "
                               "image", param=param, code="image_too_large", reason="too_large")
    return bytes(buf)
