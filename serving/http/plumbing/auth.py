"""API keys: `Authorization: Bearer KEY` checked in constant time; 401 in OpenAI's shape."""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from graft.serving.http.openai.openai_chat import APIError


def peer_headers(api_keys: tuple[str, ...]) -> dict[str, str]:
    """What this server sends when it calls another worker of its fleet (KV pulls, encoder
    cache peers): its own first key, as workers of one fleet share their keys."""
    return {"Authorization": f"Bearer {api_keys[0]}"} if api_keys else {}


class APIKeys:
    """The keys a server accepts (none: no auth). Keys are compared as SHA-256 digests with
    hmac.compare_digest against every key, so timing tells neither a key's length, nor
    which key matched, nor how much of a guess was right."""

    def __init__(self, keys: list[str] | tuple[str, ...] = ()):
        self._digests = [_digest(k) for k in keys if k]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def accepts(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        given = _digest(token.strip())
        ok = False
        for digest in self._digests:  # no early exit
            ok |= hmac.compare_digest(given, digest)
        return ok and scheme.lower() == "bearer"

    def require(self, request: Request) -> None:
        """FastAPI dependency: raise the 401 unless the request carries an accepted key."""
        if not self._digests:
            return
        header = request.headers.get("authorization")
        if self.accepts(header):
            return
        message = ("Incorrect API key provided." if header else
                   "You didn't provide an API key; send it as 'Authorization: Bearer KEY'.")
        raise APIError(message, status=401, code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
