"""Server settings and the per-app context the routes share: the served models, the engine
worker, metrics wiring. (A request's way to the engine is serving/http/openai/chat_request.py.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from graft.errors import GraftError
from graft.serving.http.openai import response_bodies as R
from graft.serving.http.engine_worker import EngineWorker
from graft.serving.http.fleet.server_info import load
from graft.serving.http.plumbing.metrics import ServerMetrics, speculation_gauges
from graft.serving.http.plumbing.vllm_metrics import VllmMetrics
from graft.serving.http.openai.responses_store import ResponseStore
from graft.serving.multimodal.media import MediaConfig, is_remote
from graft.serving.multimodal.remote_media import RemoteFetchPool


@dataclass
class ServerSettings:
    model_name: str = "graft"  # the `model` clients must send (also listed by /v1/models)
    # request field -> the model's default where a request leaves it unset (sampling_defaults.py)
    sampling_defaults: dict = field(default_factory=dict)
    media: MediaConfig = field(default_factory=MediaConfig)  # image sources and limits
    limit_images_per_prompt: int = 4  # more image parts than this -> 400
    default_ttft_budget_ms: float | None = None  # budget for requests that give none
    encoder_tokens_per_step: int = 4096  # image tokens encoded between two engine steps
    admission_slack: float = 1.0  # >1 makes admission control more conservative
    shrink_images_to_budget: bool = False  # downscale native-resolution images to fit a budget
    # special-token text typed in messages becomes control tokens (trusted clients only)
    parse_special_tokens_in_text: bool = False
    reasoning_parser: str | None = None  # reasoning.FORMATS: thinking split into `reasoning`
    tool_call_parser: str = "hermes"  # tool_calls.TOOL_CALL_PARSERS: how "auto" calls read
    api_keys: tuple[str, ...] = ()  # accepted `Authorization: Bearer` keys (none: no auth)
    auth_health: bool = False  # /health needs a key too (off: load balancers probe freely)
    auth_metrics: bool = False  # /metrics needs a key too
    # host names answered in Host headers (empty: any); serve_cli sets the loopback names when
    # bound to loopback without a key (DNS rebinding), see request_guard.allowed_host_names
    allowed_hosts: tuple[str, ...] = ()
    max_queued_requests: int | None = None  # waiting for a first token beyond this -> 429
    max_queued_tokens: int | None = None  # their prompt tokens beyond this -> 429
    request_body_timeout_s: float = 60.0  # a body still arriving after this -> 408
    # a request line + headers over this -> 431 (uvicorn only bounds a header block that has
    # not yet arrived whole: one that comes in one read passes its limit)
    max_header_bytes: int | None = None
    request_timeout_s: float | None = 600.0  # answer not complete this long after arrival: 408
    kv_transfer: object = None  # fleet.pd.KVTransferConfig: this worker's P/D role (None: none)
    advertised_address: tuple[str, int] = ("127.0.0.1", 8000)  # how other workers reach this one
    encoder_cache_peers: tuple[str, ...] = ()  # workers asked for embeddings before encoding
    pooling: str = "last"  # how /v1/embeddings pools (engine/pooling.py): last, mean or cls
    responses_store_bytes: int = 0  # /v1/responses kept for previous_response_id (0: none)


def prompt_char_bound(tokenizer, max_model_len: int) -> int | None:
    """The most characters of message text that can fit in `max_model_len` tokens: no token
    decodes to more characters than its vocabulary string has (a byte-level BPE symbol stands
    for one byte, a SentencePiece piece for its text, "<0x0A>" for one byte), so longer text
    is over the context before it is tokenized. None without a tokenizer."""
    if tokenizer is None:
        return None
    longest = max((len(tok) for tok in tokenizer.get_vocab()), default=1)
    return max_model_len * max(longest, 1)


class ServerContext:
    """Everything a handler needs; built once per app."""

    def __init__(self, engine, settings: ServerSettings):
        self.engine = engine
        self.front = engine.grafts.front()  # the default graft (a run dir served alone), or None
        self.settings = settings
        self.kv_transfer = settings.kv_transfer
        self.advertised_address = settings.advertised_address
        self.nixl = None  # kv_nixl.NixlAgent over the KV pool when KV moves over NIXL
        if self.kv_transfer is not None:
            from graft.serving.http.fleet.pd import start_nixl

            engine.kv_exports.ttl_s = self.kv_transfer.export_ttl_s
            start_nixl(self)
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.max_prompt_chars = prompt_char_bound(self.tokenizer, self.max_model_len)
        self.responses = ResponseStore(settings.responses_store_bytes)
        self.metrics = ServerMetrics({
            "graft_queue_depth": ("Requests waiting for their first token.",
                                  lambda: self.worker.queue_depth()),
            "graft_running_requests": ("Requests inside the engine.",
                                       lambda: self.worker.num_running()),
            "graft_kv_blocks_used": ("KV cache blocks in use.",
                                     lambda: self.kv_blocks()[0]),
            "graft_kv_blocks_total": ("KV cache blocks in the pool.",
                                      lambda: self.kv_blocks()[1]),
            "graft_encoder_cache_hit_rate": ("Encoder cache hits / lookups.",
                                             lambda: self._cache_stat("hit_rate")),
            "graft_encoder_cache_bytes": ("Bytes of embeddings in the encoder cache.",
                                          lambda: self._cache_stat("bytes")),
            "graft_encoder_cache_pinned_bytes": ("Encoder cache bytes pinned by live requests.",
                                                 lambda: self._cache_stat("pinned_bytes")),
            "graft_encoder_cache_hits": ("Encoder cache hits.", lambda: self._cache_stat("hits")),
            "graft_encoder_cache_misses": ("Encoder cache misses.",
                                           lambda: self._cache_stat("misses")),
            "graft_encoder_cache_evictions": ("Encoder cache evictions.",
                                              lambda: self._cache_stat("evictions")),
            **speculation_gauges(engine),
        })
        if self.kv_transfer is not None:
            from graft.serving.http.fleet.pd import transfer_series

            self.metrics.families += transfer_series(engine)
        self.grafts = engine.grafts
        # served model name -> its multimodal front (None: the bare LLM, text only); named
        # grafts are served under their names beside the bare LLM, a default one as the model
        self.models = {settings.model_name: self.front}
        if self.grafts.default is None:
            if settings.model_name in self.grafts:
                raise GraftError(f"model name {settings.model_name!r} names both the bare LLM "
                                 "and a graft; pick another --served-model-name or graft name")
            self.models.update(self.grafts.fronts)
        for name, front in self.models.items():
            self.metrics.add_graft(name, (lambda f=front: (f.hits, f.misses)) if front else None)
        # requests with images are prepared (fetched, decoded, hashed) on threads of their own,
        # and those with remote image URLs on others again, each within one deadline: slow
        # image hosts wait there, never in the pools that local images and text use
        self.media_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="graft-media")
        self.remote_media_pool = RemoteFetchPool(settings.media)
        self.worker = EngineWorker(engine, self.metrics,
                                   settings.encoder_tokens_per_step, settings.admission_slack,
                                   max_queued=settings.max_queued_requests,
                                   max_queued_tokens=settings.max_queued_tokens)
        bm = engine.block_manager  # vLLM's names for the same state (docs/fleet.md)
        self.metrics.add_vllm(VllmMetrics(settings.model_name, lambda: load(self),
                                          lambda: (bm.query_tokens, bm.hit_tokens)))

    def kv_blocks(self) -> tuple[int, int]:
        """(blocks in use, blocks in the pool)."""
        return self.engine.kv_usage()

    def _cache_stat(self, name: str) -> float:
        return float(self.worker.cache.stats()[name])

    def image_pool(self, urls: list[str]):
        """The pool that prepares a request with these image URLs."""
        return self.remote_media_pool if any(map(is_remote, urls)) else self.media_pool

    @property
    def max_body_bytes(self) -> int:
        """Every allowed image as base64 (4/3), where a served model takes images, plus
        generous room for the text."""
        images = any(front is not None for front in self.models.values())
        per_image = self.settings.media.max_image_bytes * 4 // 3 if images else 0
        return self.settings.limit_images_per_prompt * per_image + (8 << 20)

    def prepare(self, req, front):
        """The EngineRequest of a parsed chat (chat_request.to_engine_request), text
        completion (completions_request.to_completion_request) or embedding input
        (embeddings_request.to_embedding_request), in a worker thread: the one
        seam per app on the request path, where tests inject failures."""
        from graft.serving.http.openai.chat_request import to_engine_request
        from graft.serving.http.openai.completions_request import (CompletionRequest,
                                                             to_completion_request)
        from graft.serving.http.openai.embeddings_request import (EmbeddingRequest,
                                                                  to_embedding_request)

        if isinstance(req, CompletionRequest):
            return to_completion_request(self, req)
        if isinstance(req, EmbeddingRequest):
            return to_embedding_request(self, req, front)
        return to_engine_request(self, req, front)

    def prompt_logprobs(self, out) -> list | None:
        """vLLM's prompt_logprobs of out's prompt tokens (None when off)."""
        return R.prompt_logprobs_body(out, lambda t: self.tokenizer.decode([t]))

    def logprobs(self, out, start: int, top: int, as_ids: bool = False) -> dict | None:
        """OpenAI logprobs of out's output tokens from index `start` on (None when off);
        `as_ids`: each token written `token_id:N` (vLLM's return_tokens_as_token_ids)."""
        if out.logprobs is None:
            return None
        ids = out.token_ids[start:len(out.logprobs)]
        return R.logprobs_body(ids, out.logprobs[start:start + len(ids)], top,
                               R.token_id_text if as_ids else lambda t: self.tokenizer.decode([t]))
