"""Image embeddings moved between workers instead of recomputed: before a request's images
are encoded, a worker asks its peers (`graft serve --encoder-cache-peers URL ...`, which
`graft fleet` sets) for the ones its own encoder cache lacks, and stores what they hold. The
routers cannot keep an image on the worker that encoded it (vllm-router routes a chat with
images on its text alone; docs/fleet.md), so the workers' caches act as one instead.

A peer answers GET /v1/graft/encoder_cache/{key} with the raw float32 rows and their shape in
`x-graft-shape`, or 404. Asking is bounded by a short timeout; a peer that is slow, down or
without the image only means the worker encodes the image itself."""

from __future__ import annotations

import asyncio
import logging

import httpx
import torch

from graft.serving.http.plumbing.auth import peer_headers

log = logging.getLogger("graft.serving")

PATH = "/v1/graft/encoder_cache/{key}"
PEER_TIMEOUT_S = 2.0


async def fetch_missing(ctx, front, images) -> int:
    """Store in the encoder cache the peers' embeddings of `images` it does not hold; returns
    how many were fetched (each is then an encoder-cache hit at admission)."""
    peers = ctx.settings.encoder_cache_peers
    if not peers or front is None:
        return 0
    missing = {im.key: im for im in images if im.key not in front.cache}
    if not missing:
        return 0
    async with httpx.AsyncClient(timeout=PEER_TIMEOUT_S,
                                 headers=peer_headers(ctx.settings.api_keys)) as client:
        got = await asyncio.gather(*(_ask(client, peers, im) for im in missing.values()))
    fetched = sum(1 for im, rows in zip(missing.values(), got)
                  if rows is not None and front.cache.put(im.key, rows))
    ctx.metrics.encoder_peer_fetches.inc(fetched)
    return fetched


async def _ask(client: httpx.AsyncClient, peers: tuple[str, ...], im) -> torch.Tensor | None:
    """The first peer's rows for this image, checked against its token count; else None."""
    for peer in peers:
        try:
            resp = await client.get(peer.rstrip("/") + PATH.format(key=im.key))
            if resp.status_code != 200:
                continue
            n, d = (int(x) for x in resp.headers["x-graft-shape"].split(","))
            if n != im.n_tokens or len(resp.content) != n * d * 4:
                log.warning("encoder-cache peer %s sent %d rows for image %s, expected %d",
                            peer, n, im.key[:12], im.n_tokens)
                continue
            return torch.frombuffer(bytearray(resp.content), dtype=torch.float32).view(n, d)
        except (httpx.HTTPError, KeyError, ValueError) as err:
            log.info("encoder-cache peer %s: %s", peer, err)
    return None


def cached_rows(cache, key: str) -> tuple[bytes, str] | None:
    """(float32 bytes, "n,d") of an embedding this worker holds, or None."""
    rows = cache.peek(key)
    if rows is None:
        return None
    rows = rows.detach().to("cpu", torch.float32).contiguous()
    return rows.numpy().tobytes(), f"{rows.shape[0]},{rows.shape[1]}"
