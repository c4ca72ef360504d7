"""Training-side backends on HF transformers: a GraftedModel, and a plain (un-grafted) LLM.

Neither streams, so TTFT is not recorded here (None); latency is the wall time of the call.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from graft.evals.backends.base import Request, Result, load_images


def _timed(fn) -> Result:
    start = time.perf_counter()
    try:
        text = fn()
    except Exception as err:  # noqa: BLE001 - a failing sample is recorded, the run goes on
        return Result(None, latency=time.perf_counter() - start, error=f"{type(err).__name__}: {err}")
    return Result(text, latency=time.perf_counter() - start)


def grafted_identity(spec, named_params) -> str:
    """Digest of what decides a graft's answers: its spec and trainable weights, given as
    (name, parameter) pairs named as in GraftedModel (`projector.*`, LoRA's `*lora_*`)."""
    import yaml

    h = hashlib.sha256(yaml.safe_dump(spec.to_dict(), sort_keys=True).encode())
    for name, param in sorted(named_params, key=lambda item: item[0]):
        if name.startswith("projector.") or "lora_" in name:
            h.update(name.encode())
            h.update(param.detach().float().cpu().numpy().tobytes())
    return "grafted:" + h.hexdigest()[:32]


class GraftedBackend:
    """A GraftedModel (or a run dir loaded with GraftedModel.from_run) answering one request at a time."""

    def __init__(self, model_or_run_dir, device: str = "cpu"):
        from graft.model import GraftedModel
        from graft.spec import GraftSpec

        if isinstance(model_or_run_dir, (str, Path)):
            model_or_run_dir = GraftedModel.from_run(model_or_run_dir, device=device)
        self.model = model_or_run_dir
        self.identity = grafted_identity(self.model.spec, self.model.named_parameters())
        # the frozen LLM, for text-only references (a config may say ~/... or $VAR/...)
        self.base_llm = GraftSpec.expand(self.model.spec.llm.path)

    def generate(self, requests: list[Request]) -> list[Result]:
        return [
            _timed(lambda r=req: self.model.chat(r.messages, load_images(r.images), r.max_new_tokens,
                                                 r.temperature, seed=r.seed))
            for req in requests
        ]

    def close(self) -> None:
        self.model = None


class PlainLLMBackend:
    """The un-grafted LLM from its HF dir: the chat template and HF generate, nothing of graft's."""

    def __init__(self, llm_dir: str | Path, dtype: str = "float32", device: str = "cpu"):
        from graft.io import sha256_file, weights_sha256
        from graft.model import load_llm

        self.llm, self.tokenizer = load_llm(str(llm_dir), dtype)
        self.llm.to(device).eval()
        self.device = device
        tok_cfg = Path(llm_dir) / "tokenizer_config.json"
        tok_digest = sha256_file(tok_cfg)[:16] if tok_cfg.is_file() else "none"
        self.identity = f"llm:{weights_sha256(llm_dir)[:32]}:{tok_digest}"
        self.base_llm = str(llm_dir)

    def _answer(self, req: Request) -> str:
        import torch

        if req.images:
            raise ValueError("a plain LLM cannot take images; use a grafted run dir for image tasks")
        text = self.tokenizer.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([self.tokenizer(text, add_special_tokens=False)["input_ids"]], device=self.device)
        kwargs = dict(max_new_tokens=req.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id)
        if req.temperature > 0:
            torch.manual_seed(req.seed)
            kwargs.update(do_sample=True, temperature=req.temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            out = self.llm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        return self.tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True).strip()

    def generate(self, requests: list[Request]) -> list[Result]:
        return [_timed(lambda r=req: self._answer(r)) for req in requests]

    def close(self) -> None:
        self.llm = None
