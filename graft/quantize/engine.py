"""One engine for every candidate: its LLM linears are re-quantized in place per plan.

Building an engine per candidate would reload the LLM, the encoder and the KV pool each time;
here they are built once, the fp32 weights are kept, and a plan swaps each linear's
low-precision copy (quantized once per module and scheme, then cached). The encoder cache of
the multimodal front therefore serves every candidate: each image is encoded once.
"""

from __future__ import annotations

from pathlib import Path

import torch


class QuantEngine:
    def __init__(self, path: str | Path, device: str = "cpu", config=None):
        """`config`: the engine options (an EngineConfig; default: the defaults on `device`)."""
        from dataclasses import replace

        from graft.evals.backends.engine import EngineBackend
        from graft.serving import EngineConfig
        from graft.serving.models.quant_config import FP32, linear_shapes

        # no prefix cache: KV computed under one plan must never serve another; eager: CUDA
        # graphs would keep calling the linears they captured; the plans set the weights
        config = replace(config or EngineConfig(device=device), enable_prefix_caching=False,
                         enforce_eager=True, quantization=None)
        self.backend = EngineBackend(path, config=config)
        self.engine = self.backend.engine
        self.runner = self.engine.runner
        self.model = self.runner.model
        self.shapes = linear_shapes(self.model)
        self.plan = {name: FP32 for name in self.shapes}
        # what each linear holds as loaded (fp32: the C-layout copy, or None over the torch
        # weights): an fp32 module goes back to exactly this
        self._loaded = {name: self.model.linear_weight(name) for name in self.shapes}
        self._fp32 = _fp32_weights(self.engine.model_dir, self.runner, self.shapes)
        self._quantized: dict[tuple[str, str], object] = {}

    @property
    def base_identity(self) -> str:
        return self.backend.identity  # built with the fp32 plan: no quantization suffix

    def quantized(self, name: str, scheme):
        """The module's weight in `scheme`, in the layout the runner would build (cached)."""
        key = (name, scheme.name)
        if key not in self._quantized:
            from graft.kernels import cpu_ops, cpu_quant
            from graft.kernels.quant_formats import quantize

            weight = quantize(self._fp32[name], scheme)
            if self.runner.device.type == "cpu" and cpu_ops.available() and \
                    cpu_quant.supports(torch.empty(0, dtype=self.runner.dtype), weight):
                cpu_quant.pack(weight)
            self._quantized[key] = weight
        return self._quantized[key]

    def module_bytes(self, name: str, scheme) -> int:
        """Bytes one decode step reads for this module in this scheme (as weight_bytes_per_token:
        a routed expert counts top_k / num_experts of its bytes, its share of a batch-1 step)."""
        if scheme.kind == "fp32":
            out, inp = self.shapes[name]
            full = out * inp * self.runner.dtype.itemsize
        else:
            full = self.quantized(name, scheme).read_bytes()
        parts = name.split(".")
        if len(parts) > 3 and parts[2:4] == ["mlp", "experts"]:
            router = self.model.layers[int(parts[1])].mlp.gate
            return round(full * router.top_k / router.num_experts)
        return full

    def apply(self, plan: dict) -> None:
        """Hold every linear in its scheme under `plan`; fp32 modules go back to what the
        engine loaded (the C-layout fp32 copy, or the torch weights), which a quantized copy
        only shadows."""
        changed = {name: self._loaded[name] if scheme.kind == "fp32" else self.quantized(name, scheme)
                   for name, scheme in plan.items() if self.plan[name] != scheme}
        self.model.set_linear_weights(changed)
        self.plan.update({name: plan[name] for name in changed})
        self.runner.quant_plan = dict(self.plan)

    def plan_backend(self, plan: dict) -> "PlanBackend":
        return PlanBackend(self, plan)

    def decode_tokens_per_s(self, n_tokens: int = 32, repeats: int = 2) -> float:
        """Batch-1 greedy decode speed under the current plan: the best of `repeats` runs of
        n_tokens after a fixed 32-token prompt (the best run is the least disturbed one)."""
        from graft.serving import SamplingParams

        prompt = [(7 * i) % max(self.runner.vocab_size - 1, 1) + 1 for i in range(32)]
        params = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True)
        best = 0.0
        for _ in range(repeats):
            out = self.engine.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
            seconds = max(out.finish_time - out.first_token_time, 1e-9)
            best = max(best, (len(out.token_ids) - 1) / seconds)
        return best

    @torch.inference_mode()
    def prefill_logits(self, ids: list[int], rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [T, vocab] of every position of one prompt (prefill only), image placeholder
        positions filled with `rows`. Runs the engine's own forward on its KV pool, so only
        while no request holds blocks (and no prefix cache exists to be corrupted)."""
        from graft.serving.models.layers import AttentionMetadata

        runner, bm = self.runner, self.engine.block_manager
        if bm.num_free_blocks != bm.num_blocks or self.engine.has_unfinished_requests():
            raise RuntimeError("prefill_logits needs an idle engine")
        n, bs, dev = len(ids), runner.block_size, runner.device
        blocks = -(-n // bs)
        if blocks > runner.num_blocks or n > runner.max_model_len:
            raise ValueError(f"calibration sequence of {n} tokens does not fit the engine")
        input_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        meta = AttentionMetadata(
            slot_mapping=torch.arange(n, dtype=torch.int64, device=dev), num_decodes=0,
            decode_block_tables=None, decode_context_lens=None,
            prefill_block_tables=torch.arange(blocks, dtype=torch.int32, device=dev)[None],
            prefill_cu_seqlens=torch.tensor([0, n], dtype=torch.int32, device=dev),
            prefill_context_lens=torch.tensor([n], dtype=torch.int32, device=dev))
        override = None if rows is None else (input_ids < 0, rows.to(dev, runner.dtype))
        pos = torch.arange(n, device=dev)
        return self.model(input_ids, runner.cos_table[pos], runner.sin_table[pos], meta,
                          torch.arange(n, device=dev), override)


class PlanBackend:
    """An eval-harness backend (identity + generate) running the shared engine under one plan;
    identity as EngineBackend gives it, so response-cache keys match `graft eval`'s."""

    def __init__(self, qe: QuantEngine, plan: dict):
        from graft.serving.models.quant_config import changes_weights, plan_digest

        self.qe, self.plan = qe, plan
        self.identity = qe.base_identity
        if changes_weights(plan, qe.runner.dtype):
            self.identity += f"+quant:{plan_digest(plan)}"

    def generate(self, requests):
        self.qe.apply(self.plan)
        return self.qe.backend.generate(requests)


def _fp32_weights(model_dir: Path, runner, names) -> dict[str, torch.Tensor]:
    """{module name: fp32 weight [out, in]}, exactly as the engine loaded it. Read back from
    the engine where it holds the weight readably (fp32 in the C layout, which unpacks
    exactly, or the module's own torch weight); the checkpoint is loaded a second time only
    when some linear is oneDNN-prepacked, an opaque copy that cannot be read back."""
    weights = {name: _held_fp32(runner, name) for name in names}
    missing = [name for name, w in weights.items() if w is None]
    if missing:
        loaded = _load_fp32(model_dir, runner)
        weights.update({name: loaded[name] for name in missing})
    return weights


def _held_fp32(runner, name: str) -> torch.Tensor | None:
    """The engine's own copy of linear `name` in the runner's dtype, or None when unreadable."""
    model = runner.model
    held = model.linear_weight(name)
    if held is not None:  # fp32 on the C kernels: the canonical tensor, unpacked on demand
        return held.dequantize().detach() if held.scheme.kind == "fp32" else None
    weight = model.embed_tokens.weight if name == "lm_head" and model.lm_head is None \
        else model.get_submodule(name).weight
    return None if weight.is_meta or weight.dtype != runner.dtype else weight.detach()


def _load_fp32(model_dir: Path, runner) -> dict[str, torch.Tensor]:
    """A second load of the checkpoint: {module name: weight [out, in]} in the runner's dtype."""
    from graft.serving.models import build_model, load_weights
    from graft.serving.models.layers import Linear

    with torch.device("meta"):
        copy = build_model(model_dir, runner.hf_config)
    copy = copy.to_empty(device=runner.device).to(runner.dtype)
    load_weights(copy, model_dir, runner.hf_config)
    weights = {name: m.weight.detach() for name, m in copy.named_modules() if isinstance(m, Linear)}
    if copy.lm_head is None:  # tied head: the engine quantizes a copy of the table
        weights["lm_head"] = copy.embed_tokens.weight.detach()
    return weights
