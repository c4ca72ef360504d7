"""Server settings and the per-app context: metrics wiring and turning a validated request
into prompt ids and SamplingParams (the work that runs in a thread, off the event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

from graft.errors import GraftError, RequestError
from graft.serving.http import openai_chat as P
from graft.serving.http.engine_worker import EngineWorker
from graft.serving.http.metrics import ServerMetrics, speculation_gauges
from graft.serving.multimodal.media import MediaConfig, load_image


@dataclass
class ServerSettings:
    model_name: str = "graft"  # the `model` clients must send (also listed by /v1/models)
    media: MediaConfig = field(default_factory=MediaConfig)  # image sources and limits
    limit_images_per_prompt: int = 4  # more image parts than this -> 400
    default_ttft_budget_ms: float | None = None  # budget for requests that give none
    encoder_tokens_per_step: int = 4096  # image tokens encoded between two engine steps
    admission_slack: float = 1.0  # >1 makes admission control more conservative
    shrink_images_to_budget: bool = False  # downscale native-resolution images to fit a budget
    # special-token text typed in messages becomes control tokens (trusted clients only)
    parse_special_tokens_in_text: bool = False
    api_keys: tuple[str, ...] = ()  # accepted `Authorization: Bearer` keys (none: no auth)
    auth_health: bool = False  # /health needs a key too (off: load balancers probe freely)
    auth_metrics: bool = False  # /metrics needs a key too
    max_queued_requests: int | None = None  # waiting for a first token beyond this -> 429
    max_queued_tokens: int | None = None  # their prompt tokens beyond this -> 429
    request_body_timeout_s: float = 60.0  # a body still arriving after this -> 408
    request_timeout_s: float | None = 600.0  # answer not complete this long after arrival: 408


class ServerContext:
    """Everything a handler needs; built once per app."""

    def __init__(self, engine, settings: ServerSettings):
        self.engine = engine
        self.front = engine.grafts.front()  # the default graft (a run dir served alone), or None
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        # every allowed image as base64 (4/3) plus generous room for the text
        self.max_body_bytes = (settings.limit_images_per_prompt * settings.media.max_image_bytes
                               * 4 // 3 + (8 << 20))
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
        self.worker = EngineWorker(engine, self.metrics,
                                   settings.encoder_tokens_per_step, settings.admission_slack,
                                   max_queued=settings.max_queued_requests,
                                   max_queued_tokens=settings.max_queued_tokens)

    def kv_blocks(self) -> tuple[int, int]:
        """(blocks in use, blocks in the pool)."""
        return self.engine.kv_usage()

    def _cache_stat(self, name: str) -> float:
        return float(self.worker.cache.stats()[name])

    # ---- request preparation (runs in a worker thread) -----------------------------------
    def prepare(self, req: P.ChatCompletionRequest, front):
        """(prompt ids, PreparedPrompt or None, messages) through `front` (None: text only).
        The context-length check runs on the text first, before any image is fetched,
        decoded or sized."""
        from graft.template import ChatTemplateError, encode_chat

        messages, refs = P.to_chat_messages(req.messages)
        limit = self.settings.limit_images_per_prompt
        if refs and front is None:
            raise P.APIError("this model is text-only (served from an LLM dir, not a run dir); "
                             "remove the image_url parts", param=refs[0][0],
                             code="images_not_supported")
        if len(refs) > limit:
            raise P.APIError(f"{len(refs)} images in the prompt; this server accepts at most "
                             f"{limit} (--limit-images-per-prompt)", param="messages",
                             code="too_many_images")
        parse = self.settings.parse_special_tokens_in_text
        try:
            text = encode_chat(self.tokenizer, messages, [0] * len(refs),  # images: empty runs
                               add_generation_prompt=True, parse_special_tokens=parse)
            self.check_room(len(text.input_ids), req.output_limit())
            if front is None:
                return text.input_ids, None, messages
            images = [front.prepare_image(load_image(url, self.settings.media, param))
                      for param, url in refs]
            front.check_cache_room(images)
            prepared = front.prompt(messages, images, parse)
        except RequestError as err:
            raise P.APIError.from_request(err) from None
        except ChatTemplateError as err:
            where = "messages" if err.message_index is None else f"messages[{err.message_index}]"
            raise P.APIError(str(err), param=where, code="invalid_prompt") from None
        except GraftError as err:
            raise P.APIError(str(err), param="messages", code="invalid_prompt") from None
        return prepared.prompt_token_ids, prepared, messages

    def shrink(self, messages: list[dict], prepared, front):
        """The prompt with its costliest image downscaled to fewer tokens, or None."""
        images = list(prepared.images)
        k = max(range(len(images)), key=lambda i: images[i].n_tokens)
        smaller = front.shrink_image(images[k])
        if smaller is None:
            return None
        images[k] = smaller
        prepared = front.prompt(messages, images,
                                self.settings.parse_special_tokens_in_text)
        return prepared.prompt_token_ids, prepared

    def logprobs(self, out, start: int, top: int) -> dict | None:
        """OpenAI logprobs of out's output tokens from index `start` on (None when off)."""
        if out.logprobs is None:
            return None
        ids = out.token_ids[start:len(out.logprobs)]
        return P.logprobs_body(ids, out.logprobs[start:start + len(ids)], top,
                               lambda t: self.tokenizer.decode([t]))

    def check_room(self, n_prompt: int, limit: int | None) -> int:
        """Tokens left for output after an n_prompt-token prompt; 400 when there are none or
        fewer than max_tokens asks for."""
        room = self.max_model_len - n_prompt
        if room <= 0 or (limit is not None and limit > room):
            asked = f" + {limit} output tokens" if limit else ""
            raise P.APIError(
                f"prompt is {n_prompt} tokens{asked}, over the model's context of "
                f"{self.max_model_len} tokens; shorten the messages or lower max_tokens",
                param="messages", code="context_length_exceeded")
        return room

    def sampling_params(self, req: P.ChatCompletionRequest, n_prompt: int):
        from graft.serving import SamplingParams

        limit = req.output_limit()
        room = self.check_room(n_prompt, limit)
        try:
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=req.top_k or 0, max_tokens=limit or room, seed=req.seed,
                stop=req.stop_list(), ignore_eos=req.ignore_eos, logprobs=req.num_logprobs(),
                speculative=req.speculative)
        except GraftError as err:
            raise P.APIError(str(err), code="invalid_value") from None
