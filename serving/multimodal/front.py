"""The engine's multimodal front: chat + images -> prompt ids with placeholder runs,
projected embeddings (through the encoder cache) and the `MultiModalInputs` the engine splices.

Placeholder runs are sized with the encoder/projector token counts before any encoding, so
budgets and cache room are known at admission.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from graft.digests import sha256_file
from graft.errors import GraftConfigError, GraftDataError
from graft.run_dir import RunDir
from graft.serving.multimodal.encoder_cache import EncoderCache, cache_key
from graft.serving.multimodal.media import LoadedImage
from graft.serving.engine.mm_inputs import ImageRange, MultiModalInputs

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


@dataclass
class PreparedImage:
    key: str  # encoder-cache key: pixels + preprocessing + encoder + adapter identity
    image: object  # PIL RGB image
    n_tokens: int  # placeholder positions (projector output rows)
    nbytes: int  # bytes of its embeddings in the cache


@dataclass
class PreparedPrompt:
    prompt_token_ids: list[int]  # IMAGE_PLACEHOLDER runs at image positions
    images: list[PreparedImage]  # in prompt order
    spans: list[tuple[int, int]]  # (offset, length) of each image's placeholder run

    @property
    def cache_bytes(self) -> int:
        """Cache bytes this prompt pins while it runs (a repeated image counts once)."""
        return unique_bytes(self.images)


def unique_bytes(images: list[PreparedImage]) -> int:
    return sum(im.nbytes for im in {im.key: im for im in images}.values())


class MultimodalFront:
    """One graft's image path (frozen encoder + projector) and the LLM tokenizer, with a
    byte-bounded embedding cache. Built by `graft.serving.multimodal.grafts.load_grafts`."""

    def __init__(self, image_path, tokenizer, spec, run_dir: str | Path | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, cache: EncoderCache | None = None):
        self.image_path = image_path  # graft.image_path.ImagePath (the engine runs the LLM)
        self.tokenizer = tokenizer
        self.spec = spec  # the run's GraftSpec
        self.run_dir = Path(run_dir) if run_dir else None  # /v1/models' root
        # several grafts over one engine share one cache (keys carry encoder + adapter identity)
        self.cache = cache if cache is not None else EncoderCache(cache_bytes)
        self.hits = 0  # this front's encoder-cache lookups (the cache's own counters sum all)
        self.misses = 0
        self.encoder_id = image_path.encoder.identity()
        adapter_file = RunDir(run_dir).adapter_weights if run_dir else None
        if adapter_file is not None and adapter_file.is_file():
            self.adapter_id = sha256_file(adapter_file)
        else:  # unsaved projector: identity from its weights
            from graft.integrity import params_digest

            self.adapter_id = params_digest(image_path.projector)
        self.preprocess_id = json.dumps(dict(spec.encoder), sort_keys=True, default=str)
        self.d_model = image_path.d_model
        self.encode_calls = 0  # encoder forward passes (a batch of unique misses = one call)

    @property
    def llm_path(self) -> str:
        from graft.spec import GraftSpec

        return GraftSpec.expand(self.spec.llm.path)

    # ---- before encoding: sizes, keys, prompt ------------------------------------------
    def prepare_image(self, loaded: LoadedImage) -> PreparedImage:
        n = self.image_path.image_token_count(loaded.width, loaded.height)
        key = cache_key(loaded.content_hash, self.preprocess_id, self.encoder_id, self.adapter_id)
        return PreparedImage(key, loaded.image, n, n * self.d_model * 4)  # float32 rows

    def shrink_image(self, im: PreparedImage, scale: float = 0.8) -> PreparedImage | None:
        """The image downscaled until it costs fewer tokens (native-resolution encoders);
        None where the token count does not depend on size or the image is already tiny."""
        from PIL import Image

        from graft.serving.multimodal.media import pixel_hash

        w, h = im.image.size
        while min(w, h) > 8:
            w, h = max(1, int(w * scale)), max(1, int(h * scale))
            if self.image_path.image_token_count(w, h) < im.n_tokens:
                small = im.image.resize((w, h), Image.BICUBIC)
                return self.prepare_image(LoadedImage(small, pixel_hash(small), w, h))
        return None

    def prompt(self, messages: list[dict], images: list[PreparedImage],
               parse_special_tokens: bool = True, template: dict | None = None
               ) -> PreparedPrompt:
        """Token ids for `messages` (one `<image>` marker per image, in order);
        parse_special_tokens=False keeps special-token text in messages plain text;
        `template`: encode_chat's template keywords (tools, add_generation_prompt, ...;
        default: the assistant's turn opened)."""
        from graft.template import encode_chat

        chat = encode_chat(self.tokenizer, messages, [im.n_tokens for im in images],
                           parse_special_tokens=parse_special_tokens,
                           **(template or {"add_generation_prompt": True}))
        return PreparedPrompt(chat.input_ids, images, list(chat.image_spans))

    def check_cache_room(self, images: list[PreparedImage]) -> None:
        """An image whose embeddings exceed the whole cache can never be served: say so now."""
        for k, im in enumerate(images):
            if im.nbytes > self.cache.max_bytes:
                raise GraftDataError(
                    f"image {k} needs {im.nbytes} bytes of embeddings ({im.n_tokens} tokens), "
                    f"more than the encoder cache holds ({self.cache.max_bytes} bytes); send a "
                    "smaller image or raise --encoder-cache-mb")
        unique = unique_bytes(images)
        if unique > self.cache.max_bytes:  # all of a prompt's images are pinned at once
            raise GraftDataError(
                f"the {len(images)} images need {unique} bytes of embeddings together, more "
                f"than the encoder cache holds ({self.cache.max_bytes} bytes); send fewer or "
                "smaller images or raise --encoder-cache-mb")

    def uncached_tokens(self, images: list[PreparedImage]) -> int:
        return sum(im.n_tokens for im in {im.key: im for im in images}.values()
                   if im.key not in self.cache)

    # ---- encoding ----------------------------------------------------------------------
    @torch.no_grad()
    def encode(self, items: list[tuple[PreparedImage, str]]) -> tuple[dict[str, torch.Tensor], int]:
        """Embeddings for (image, owner request id) pairs, each pinned for its owner.

        Cache hits are reused; the unique misses are encoded in one batch (the same image
        twice is encoded once). Returns ({key: [n_tokens, d_model]}, image tokens encoded).
        """
        out: dict[str, torch.Tensor] = {}
        todo: dict[str, PreparedImage] = {}
        for im, owner in items:
            if im.key in todo:
                continue  # already queued for this batch: encoded once, pinned below
            hit = self.cache.get(im.key, owner)
            if hit is None:
                self.misses += 1
                todo[im.key] = im
            else:
                self.hits += 1
                out[im.key] = hit
        encoded = 0
        if todo:
            feats = self.image_path.image_features([im.image for im in todo.values()])
            self.encode_calls += 1
            for (key, im), rows in zip(todo.items(), feats):
                if rows.shape[0] != im.n_tokens:
                    raise GraftConfigError(
                        f"encoder+projector produced {rows.shape[0]} rows for a "
                        f"{im.image.size} image but num_tokens promised {im.n_tokens}")
                out[key] = rows.detach().float().contiguous()  # [n_tokens, d_model]
                encoded += im.n_tokens
        for im, owner in items:
            if im.key in todo:
                self.cache.put(im.key, out[im.key], owner)  # first put stores, later ones pin
        return out, encoded

    def mm_inputs(self, prepared: PreparedPrompt, embeds: dict[str, torch.Tensor],
                  owner: str = "offline") -> MultiModalInputs | None:
        """The engine's image inputs; an image missing from `embeds` (its KV came from
        another worker) is encoded for `owner` only if the engine ever asks for its rows."""
        if not prepared.images:
            return None

        def rows(im: PreparedImage):
            if im.key in embeds:
                return embeds[im.key]
            return lambda: self.encode([(im, owner)])[0][im.key]

        return MultiModalInputs([ImageRange(off, n, im.key, rows(im))
                                 for im, (off, n) in zip(prepared.images, prepared.spans)])

    def prepare_chat(self, messages: list[dict], images: list, owner: str = "offline"
                     ) -> tuple[list[int], MultiModalInputs | None]:
        """Offline path: PIL images + messages with `<image>` markers -> (prompt ids,
        mm_inputs) for `Engine.add_request`; release with `cache.release(owner)` when done."""
        from graft.serving.multimodal.media import pixel_hash

        prepared_images = []
        for im in images:
            rgb = im.convert("RGB")
            prepared_images.append(self.prepare_image(
                LoadedImage(rgb, pixel_hash(rgb), rgb.width, rgb.height)))
        self.check_cache_room(prepared_images)
        prepared = self.prompt(messages, prepared_images)
        embeds, _ = self.encode([(im, owner) for im in prepared.images])
        return prepared.prompt_token_ids, self.mm_inputs(prepared, embeds)


def generate_chats(engine, chats: dict[str, tuple], sampling_params) -> dict:
    """Offline multimodal generate: {request id: (messages with `<image>` markers, PIL
    images[, graft name])} -> {request id: final RequestOutput}, all in one continuous
    batch through `Engine.generate`. The graft name picks `engine.grafts[name]` (several
    grafts); else the engine's default graft."""
    fronts, ids, mms, names = {}, [], [], []
    try:
        for rid, (messages, images, *graft) in chats.items():
            names.append(graft[0] if graft else None)
            front = engine.grafts.front(names[-1])
            if front is None:
                raise GraftConfigError(f"chat {rid!r}: this engine serves a bare LLM dir (no "
                                       "graft); load a run dir or name a graft")
            fronts[rid] = front
            prompt_ids, mm = front.prepare_chat(messages, images, owner=rid)
            ids.append(prompt_ids)
            mms.append(mm)
        outs = engine.generate(prompt_token_ids=ids, sampling_params=sampling_params,
                               mm_inputs=mms, request_ids=list(fronts), grafts=names)
    finally:  # the embeddings stay cached for later prompts, unpinned
        for rid, front in fronts.items():
            front.cache.release(rid)
    return dict(zip(fronts, outs))


_stream_ids = itertools.count()


def stream_chat(engine, messages: list[dict], images, sampling_params, on_text, graft=None):
    """One chat answered step by step (graft chat's REPL): `on_text(piece)` after each engine
    step that added text; returns the final RequestOutput. With no graft (a bare LLM engine),
    text only. Ctrl-C (or any error) aborts the request at the engine before it propagates."""
    from graft.template import encode_chat

    rid = f"stream-{next(_stream_ids)}"
    front = engine.grafts.front(graft)
    if front is None:
        if images:
            raise GraftConfigError("this engine serves a bare LLM dir (no graft): no images")
        ids, mm = encode_chat(engine.tokenizer, messages, [], add_generation_prompt=True).input_ids, None
    else:
        ids, mm = front.prepare_chat(messages, list(images), owner=rid)
    final = None
    try:
        engine.add_request(rid, prompt_token_ids=ids, sampling_params=sampling_params,
                           mm_inputs=mm, graft=graft)
        while final is None and engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id != rid:
                    continue
                if out.new_text:
                    on_text(out.new_text)
                if out.finished:
                    final = out
    finally:
        if final is None:
            engine.abort(rid)
        if front is not None:  # the embeddings stay cached for later turns, unpinned
            front.cache.release(rid)
    return final
