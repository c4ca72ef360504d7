"""GraftedModel: frozen encoder + trainable projector + frozen HF causal LM.

This is the training-side path (and `graft chat`): HF transformers runs the LLM on
`inputs_embeds` built by graft.inject. The serving engine reuses the same splice.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from graft.answer_loss import answer_loss, answer_loss_applies
from graft.errors import GraftConfigError
from graft.gguf_llm import from_pretrained_kwargs, quiet_gguf_bar
from graft.image_path import ImagePath, llm_dir
from graft.inject import embed_with_images
from graft.run_dir import RunDir
from graft.spec import GraftSpec

log = logging.getLogger("graft")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sampling_kwargs(temperature: float, top_p: float = 1.0, seed: int | None = None) -> dict:
    """HF generate's sampling arguments: greedy at temperature 0, else sampling from the
    smallest set of tokens whose probability reaches top_p (1: all), seeded when given."""
    if temperature <= 0:
        return dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    if seed is not None:
        torch.manual_seed(seed)
    return dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)


def load_llm(path: str, dtype: str = "float32", weights: bool = True):
    """(LLM, tokenizer) from a local HF dir; weights=False builds the LLM on the meta device
    from config.json alone (sharded training fills it from another rank)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = llm_dir(path)
    if dtype not in DTYPES:
        raise GraftConfigError(f"llm.dtype={dtype!r}: use one of {', '.join(DTYPES)}")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not weights:
        return meta_llm(path, dtype)[0], tokenizer
    # a dir graft.gguf_llm made: transformers dequantizes the GGUF file (HF's own reading)
    with quiet_gguf_bar():
        llm = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype],
                                                   **from_pretrained_kwargs(path))
    return llm, tokenizer


def meta_llm(path: str, dtype: str = "float32"):
    """(LLM, its config): the module tree on the meta device from config.json alone, no
    weights read (the plan counts it; sharded ranks receive its weights from rank 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(llm_dir(path))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype]), config


class GraftedModel(nn.Module):
    """The training model. Its image half is `self.image_path` (the same encoder and projector
    modules, registered here so optimizers, DDP and state_dict see them)."""

    def __init__(self, spec: GraftSpec, image_path: ImagePath, llm, tokenizer):
        super().__init__()
        self.spec = spec
        self.encoder = image_path.encoder
        self.projector = image_path.projector
        self.image_path = image_path
        self.llm = llm
        self.tokenizer = tokenizer
        self.llm.eval()
        for p in self.llm.parameters():
            p.requires_grad_(False)

    # ---- construction --------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: GraftSpec, adapter_dir: str | Path | None = None,
                  llm_weights: bool = True, image_path: ImagePath | None = None) -> "GraftedModel":
        """Build from a spec: the LLM from spec.llm.path (on the meta device when not
        llm_weights), the projector from adapter_dir (else spec.adapter_init, else freshly
        initialised), or `image_path` as built already (`ImagePath.from_spec`, which needs no
        LLM weights)."""
        llm, tokenizer = load_llm(spec.llm.path, spec.llm.dtype, weights=llm_weights)
        d_model = llm.get_input_embeddings().embedding_dim
        if image_path is None:
            image_path = ImagePath.from_spec(spec, d_model, adapter_dir)
        elif image_path.d_model != d_model:
            raise GraftConfigError(f"the projector gives {image_path.d_model}-wide tokens but the "
                                   f"LLM in {spec.llm.path} embeds {d_model}-wide ones")
        return cls(spec, image_path, llm, tokenizer)

    @classmethod
    def from_run(cls, run_dir: str | Path, device: str = "cpu") -> "GraftedModel":
        """Load a training run dir (graft.yaml + adapter.safetensors [+ lora/])."""
        run = RunDir.open(run_dir)
        model = cls.from_spec(run.load_spec(), adapter_dir=run.path)
        if run.has_lora:
            from peft import PeftModel

            model.llm = PeftModel.from_pretrained(model.llm, str(run.lora_dir))
            model.llm.eval()
        return model.to(device)

    # ---- image path ----------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.image_path.device

    def image_token_count(self, width: int, height: int) -> int:
        return self.image_path.image_token_count(width, height)

    def encode_images(self, images) -> list[torch.Tensor]:
        return self.image_path.encode_images(images)

    def project(self, features: list[torch.Tensor], sizes: list[tuple[int, int]]) -> list[torch.Tensor]:
        return self.image_path.project(features, sizes)

    def image_features(self, images) -> list[torch.Tensor]:
        return self.image_path.image_features(images)

    # ---- LLM path ------------------------------------------------------------------
    def embed(self, input_ids: torch.Tensor, image_feats: list[torch.Tensor]) -> torch.Tensor:
        feats = torch.cat(image_feats, 0) if image_feats else None
        embeds = embed_with_images(input_ids, self.llm.get_input_embeddings(), feats)
        return embeds

    def forward(self, input_ids, attention_mask, labels, vision_feats: list[torch.Tensor],
                sizes: list[tuple[int, int]]):
        """Training forward: projection happens here so DDP sees the trainable params."""
        from transformers.modeling_outputs import CausalLMOutput

        embeds = self.embed(input_ids, self.project(vision_feats, sizes))
        if not answer_loss_applies(self.llm):
            return self.llm(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels,
                            use_cache=False)
        return CausalLMOutput(loss=answer_loss(self.llm, embeds, input_ids, attention_mask, labels))

    @torch.no_grad()
    def generate_ids(self, input_ids: list[int], images=(), max_new_tokens: int = 64,
                     temperature: float = 0.0, seed: int | None = None,
                     top_p: float = 1.0, on_text=None) -> list[int]:
        ids = torch.tensor([input_ids], device=self.device)
        embeds = self.embed(ids, self.image_features(list(images)))
        kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                      streamer=text_streamer(self.tokenizer, on_text),
                      **sampling_kwargs(temperature, top_p, seed))
        out = self.llm.generate(inputs_embeds=embeds, attention_mask=torch.ones_like(ids), **kwargs)
        return out[0].tolist()

    def chat(self, messages: list[dict], images=(), max_new_tokens: int = 64,
             temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0,
             on_text=None) -> str:
        """Answer a chat (user text with `<image>` markers, one per image) with HF generate;
        temperature 0 is greedy, else sampling with nucleus top_p. `on_text(piece)` receives
        the answer as it is generated (whole words)."""
        from graft.template import encode_chat

        images = list(images)
        counts = [self.image_token_count(*im.size) for im in images]
        chat = encode_chat(self.tokenizer, messages, counts, add_generation_prompt=True)
        new = self.generate_ids(chat.input_ids, images, max_new_tokens, temperature, seed, top_p,
                                on_text)
        return self.tokenizer.decode(new, skip_special_tokens=True).strip()

    def describe(self) -> dict:
        """Components and parameter counts, frozen vs trainable (for `graft inspect`)."""
        def count(module):
            total = sum(p.numel() for p in module.parameters())
            train = sum(p.numel() for p in module.parameters() if p.requires_grad)
            return {"params": total, "trainable": train, "frozen": total - train}

        return {
            "encoder": {"kind": self.spec.encoder.get("kind"), "hidden_size": self.encoder.hidden_size,
                        "identity": self.encoder.identity(), **count(self.encoder)},
            "projector": {"kind": self.projector.config.kind, "d_vision": self.projector.d_vision,
                          "d_model": self.projector.d_model, **count(self.projector)},
            "llm": {"path": self.spec.llm.path, "class": type(self.llm).__name__, **count(self.llm)},
        }


def text_streamer(tokenizer, on_text):
    """An HF generate streamer that hands decoded pieces of the answer to `on_text` (None:
    no streaming); the prompt is not repeated."""
    if on_text is None:
        return None
    from transformers import TextStreamer

    class _Pieces(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            if text:
                on_text(text)

    return _Pieces(tokenizer, skip_prompt=True, skip_special_tokens=True)
