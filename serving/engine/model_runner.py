"""Loads the decoder, owns the paged KV cache and the RoPE tables, and runs one batched forward.

Per step it turns the scheduled (sequence, chunk) pairs into flat token tensors plus paged
attention metadata, splices image rows for placeholder positions, and returns the logits of
the sequences whose chunk reaches their last token.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from graft.errors import GraftConfigError
from graft.kernels import cpu_linear, cpu_ops, cpu_quant, huge_pages, rope_cos_sin
from graft.kernels.dispatch import kernels_mode
from graft.kernels.linear_dispatch import resolve_mode
from graft.serving.engine import pooling, prompt_logprobs
from graft.serving.engine.config import EngineConfig
from graft.serving.models import build_model, load_weights, resolve_architecture
from graft.serving.models.layers import AttentionMetadata, rope_inv_freq
from graft.serving.models.linear_paths import plan_linear_paths
from graft.serving.models.gguf_weights import gguf_quantization
from graft.serving.models.quant_config import QuantConfig, linear_shapes
from graft.serving.engine.scheduler import ScheduledBatch
from graft.serving.engine.sequence import Sequence

log = logging.getLogger("graft.serving")


def quant_backend(device: torch.device) -> str:
    """Which quantized-linear path the engine's weights run on (for the load log)."""
    if device.type == "cuda":
        return "Triton"
    if cpu_ops.available():
        return f"the C kernels ({cpu_quant.isa_description()})"
    return f"the PyTorch reference ({cpu_ops.unavailable_reason()})"


def default_quantization(config: EngineConfig, device: torch.device) -> str | None:
    """What quantization=None means on CPU with the C kernels built (kernels mode auto/cpu).
    fp32 on an AVX2 or AVX-512 CPU: every linear in fp32 on them ("fp32": measured faster than
    the oneDNN-prepacked torch linears at batch 1 and 16-32, all-decode steps run as one C
    call, and prefill rows go to torch's F.linear on the dequantized weight where
    linear_dispatch measures that faster). bf16 where
    the bf16 dot products run (AVX512-BF16: AMD Zen 4, Intel Cooper Lake, and with AMX tiles
    for calls of 8 rows or more, Intel Sapphire Rapids and later): every linear in bf16 on
    them ("bf16", the weights as loaded: measured faster than torch's oneDNN bf16 linears at
    batch 1 and 32 and in serving, the steps in one C call; level at prefill without AMX,
    ahead with AMX, where the prefill attention runs on the tiles too); bf16 on AVX2 too, where torch has no native bf16 matmul and the C
    tiles widen bf16 to fp32 in registers (docs/benchmarks.md, issue 49). Else (GPU, fp16,
    GRAFT_KERNELS=reference, other CPUs, where the C path was not measured against torch's)
    the model's own linears."""
    if device.type != "cpu" or kernels_mode() not in ("auto", "cpu") or not cpu_ops.available():
        return None
    if config.dtype == "float32" and cpu_quant.isa() != "portable":
        return "fp32"
    if config.dtype == "bfloat16" and (cpu_quant.bf16_dot() or cpu_quant.isa() == "avx2"):
        return "bf16"
    return None


class ModelRunner:
    def __init__(self, model_dir: str | Path, config: EngineConfig):
        from transformers import AutoConfig

        resolve_architecture(model_dir)  # a clear error before transformers sees the config
        self.config = config
        self.model_dir = Path(model_dir)
        self.hf_config = AutoConfig.from_pretrained(str(model_dir))
        self.device = torch.device(config.device)
        self.dtype = config.torch_dtype
        max_pos = getattr(self.hf_config, "max_position_embeddings", None) or 2048
        if config.max_model_len is not None and config.max_model_len > max_pos:
            raise GraftConfigError(
                f"EngineConfig.max_model_len={config.max_model_len} exceeds the model's "
                f"max_position_embeddings={max_pos}; lower it or leave it None")
        self.max_model_len = config.max_model_len or max_pos
        with torch.device("meta"):  # no random init: every weight comes from the checkpoint
            model = build_model(model_dir, self.hf_config)
        inv_freq, rope_scaling, _ = rope_inv_freq(self.hf_config, model.head_dim)
        shapes = linear_shapes(model)
        quant = self._default_quantization(shapes) \
            if config.quantization is None else config.quant_config  # parsed once, in config
        # checked on the shape-only model: a bad pattern or group size fails before any weight loads
        self.quant_plan = (quant.plan(shapes, embedding=tuple(model.embed_tokens.weight.shape))
                           if quant is not None else {})
        # on meta the cast is free; to_empty's pages stay untouched for a linear loaded as the
        # file's int4 blocks (load_weights drops its dense weight unwritten)
        model = model.to(self.dtype).to_empty(device=self.device)
        load_weights(model, model_dir, self.hf_config, self.quant_plan)
        c_layout = self.device.type == "cpu" and cpu_ops.available() and self.dtype == torch.float32
        if self.quant_plan:
            model.quantize_linears(self.quant_plan, fp32_in_c_layout=c_layout)
            model = model.to(self.dtype)
            if self.device.type == "cpu" and cpu_ops.available():
                for weight in model.quantized_weights():  # the C layout now, not on the first step
                    if cpu_quant.supports(torch.empty(0, dtype=self.dtype), weight):
                        cpu_quant.pack_only(weight)
                cpu_quant.gather_on_huge_pages(model.quantized_weights())
                model.read_table_from_head()  # a tied fp32 / bf16 head: one copy of the table
            log.info("weights: %s (%s; quantized linears on %s)", quant.describe(self.quant_plan),
                     quant.source, quant_backend(self.device))
        self.linear_paths = None  # what plan_linear_paths chose, when linears are in the C layout
        if self.quant_plan and self.device.type == "cpu" and kernels_mode() in ("auto", "cpu"):
            self.linear_paths = plan_linear_paths(
                model, resolve_mode(config.linear_dispatch), self.dtype)
        if self.device.type == "cpu" and cpu_linear.enabled(self.dtype):
            model.prepack_linears()
        self.model = model.eval()
        if self.device.type == "cpu":  # loading's temporaries: ~1.3 GB for a 1.5B model in int4
            huge_pages.return_freed_heap()
        self.vocab_size = self.hf_config.vocab_size
        self.hidden_size = self.hf_config.hidden_size
        # RoPE tables for every position, built once (HF: cos * attention_scaling, cast to dtype)
        positions = torch.arange(self.max_model_len, device=self.device)
        cos, sin = rope_cos_sin(positions, inv_freq.to(self.device))
        self.cos_table = (cos * rope_scaling).to(self.dtype)  # [max_len, R/2]
        self.sin_table = (sin * rope_scaling).to(self.dtype)
        self.block_size = config.block_size
        self.num_blocks = self._num_kv_blocks()
        self._allocate_kv_cache()
        if (self.quant_plan and self.device.type == "cpu" and cpu_ops.available()
                and self.dtype in (torch.float32, torch.bfloat16)):
            why_not = model.enable_fused_decode()
            how = "one C call per step" if why_not is None else f"op by op ({why_not})"
            log.info("decode steps: %s", how)
        self.decode_graphs = None
        if self.device.type == "cuda" and not config.enforce_eager and model.graph_unsafe_reason:
            log.info("decode steps: eager, no CUDA graphs (%s)", model.graph_unsafe_reason)
        elif self.device.type == "cuda" and not config.enforce_eager:
            from graft.serving.engine.cuda_graphs import DecodeGraphs, capture_sizes

            self.decode_graphs = DecodeGraphs(self, capture_sizes(config.max_num_seqs))

    def _default_quantization(self, shapes: dict[str, tuple[int, int]]) -> QuantConfig | None:
        """quantization=None: the file's own int4 for a GGUF's Q4_0/Q4_1 linears; the rest,
        and other dirs, default_quantization ("fp32", as loaded, where that is none)."""
        default = default_quantization(self.config, self.device)
        return (gguf_quantization(self.model_dir, default or "fp32", shapes)
                or QuantConfig.parse(default))

    # --- KV cache -------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        """KV bytes of one block over all layers: K and V values, plus an int8 cache's scales."""
        m = self.model
        elem = torch.empty((), dtype=self.config.kv_torch_dtype).element_size()
        per_head = m.head_dim * elem + (4 if self.config.kv_torch_dtype == torch.int8 else 0)
        return 2 * len(m.layers) * self.block_size * m.num_kv_heads * per_head

    def _num_kv_blocks(self) -> int:
        cfg, per_block = self.config, self.bytes_per_block()
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        if cfg.kv_cache_memory is not None:
            blocks = cfg.kv_cache_memory // per_block
            if blocks < 1:
                raise GraftConfigError(
                    f"EngineConfig.kv_cache_memory={cfg.kv_cache_memory} bytes holds no KV block "
                    f"({per_block} bytes each); raise it")
            return blocks
        # default: room for max_num_seqs full-length sequences, capped by free memory
        want = cfg.max_num_seqs * -(-self.max_model_len // self.block_size)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = int(free * cfg.kv_cache_fraction)
        else:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            budget = min(int(avail * cfg.kv_cache_fraction), cfg.cpu_kv_cache_cap)
        blocks = min(want, budget // per_block)
        if blocks < 1:
            raise GraftConfigError("not enough free memory for one KV block; set "
                                   "EngineConfig.num_kv_blocks or kv_cache_memory explicitly")
        return blocks

    def _allocate_kv_cache(self) -> None:
        m = self.model
        shape = (len(m.layers), 2, self.num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        kv_dtype = self.config.kv_torch_dtype
        # zeros, not empty: kernels may read (and mask) padding slots of a block; on CPU on
        # 2 MB pages (decode reads blocks from all over the pool)
        self.kv_cache = self._pool_zeros(shape, kv_dtype)
        # int8: one fp32 scale per cached token and KV head (graft.kernels.reference.store_kv)
        self.kv_scales = (self._pool_zeros(shape[:-1], torch.float32)
                          if kv_dtype == torch.int8 else None)
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            attn.k_cache, attn.v_cache = self.kv_cache[i, 0], self.kv_cache[i, 1]
            if self.kv_scales is not None:
                attn.k_scale, attn.v_scale = self.kv_scales[i, 0], self.kv_scales[i, 1]

    def _pool_zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.device.type == "cpu":
            return huge_pages.zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    # --- one forward ----------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence], list, list]:
        """Run batch; return logits fp32 and the B sequences they belong to: one row per
        sequence, or 1 + len(seq.spec_tokens) rows for a sequence verifying proposals; the
        prompt-logprob rows, (seq, first position, logits [n, vocab]) per sequence that
        wants them (prompt_logprobs.py); and the pooled rows, (seq, first position, hidden
        [n, d]) per pooling sequence whose chunk holds any (pooling.py)."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_idx: list[int] = []
        sampling: list[Sequence] = []
        tables: list[list[int]] = []
        ctx_lens: list[int] = []
        cu = [0]
        mm_rows = []
        prompt_rows: list[tuple[Sequence, int, list[int]]] = []  # (seq, first position, flat rows)
        pooled_rows: list[tuple[Sequence, int, list[int]]] = []  # the same, hidden states
        for seq, n in zip(batch.seqs, batch.num_tokens):
            start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
            table = seq.block_table
            ids.extend(seq.token_ids[start:end])
            draft = seq.spec_tokens  # proposals after the last token: their logits verify them
            ids.extend(draft)
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            tables.append(table)
            ctx_lens.append(end)
            cu.append(cu[-1] + n)
            if end == len(seq) + len(draft) and seq.pooling is None:
                logits_idx.extend(range(len(ids) - 1 - len(draft), len(ids)))
                sampling.append(seq)
            first_row = len(ids) - len(draft) - n
            for wanted, kept in ((prompt_logprobs.positions(seq, start, end), prompt_rows),
                                 (pooling.positions(seq, start, end), pooled_rows)):
                if wanted:
                    kept.append((seq, wanted.start, [first_row + p - start for p in wanted]))
            if seq.mm_inputs is not None:
                rows = seq.mm_inputs.rows_for(start, end)
                if rows is not None:
                    mm_rows.append(rows)
        nd = batch.num_decodes
        graphs = self.decode_graphs
        if (graphs is not None and nd == len(tables) and not mm_rows and not prompt_rows
                and not pooled_rows and graphs.fits(nd)):
            return graphs.run(ids, positions, slots, tables, ctx_lens), sampling, [], []
        fused = getattr(self.model, "fused_decode", None)
        if (fused is not None and not mm_rows and len(sampling) == len(tables)
                and fused.step_applies(nd, len(tables)) and self.cos_table.is_contiguous()):
            # the CPU fast path: the whole step, ids to logits, in one C call (every row
            # decodes one token and is sampled)
            return fused.step(ids, positions, slots, tables, ctx_lens, self.cos_table,
                              self.sin_table), sampling, [], []
        dev = self.device
        input_ids = torch.tensor(ids, dtype=torch.int64, device=dev)
        pos = torch.tensor(positions, dtype=torch.int64, device=dev)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            num_decodes=nd,
            decode_block_tables=_pad_tables(tables[:nd], dev) if nd else None,
            decode_context_lens=torch.tensor(ctx_lens[:nd], dtype=torch.int32, device=dev)
            if nd else None,
            prefill_block_tables=_pad_tables(tables[nd:], dev) if len(tables) > nd else None,
            prefill_cu_seqlens=torch.tensor([c - cu[nd] for c in cu[nd:]], dtype=torch.int32,
                                            device=dev) if len(tables) > nd else None,
            prefill_context_lens=torch.tensor(ctx_lens[nd:], dtype=torch.int32, device=dev)
            if len(tables) > nd else None,
        )
        override = None
        if mm_rows:
            rows = torch.cat(mm_rows).to(device=dev, dtype=self.dtype)  # [n_image_positions, d]
            override = (input_ids < 0, rows)
        cos, sin = self.cos_table[pos], self.sin_table[pos]  # [T, R/2]
        n_sampled = len(logits_idx)
        for _, _, rows in prompt_rows:  # after the sampled rows: those stay rows 0..B-1
            logits_idx.extend(rows)
        logits_at = torch.tensor(logits_idx, dtype=torch.int64, device=dev)
        hidden = None
        if pooled_rows:
            hidden_at = torch.tensor([r for _, _, rows in pooled_rows for r in rows],
                                     dtype=torch.int64, device=dev)
            logits, hidden = self.model(input_ids, cos, sin, meta, logits_at, override, hidden_at)
        else:
            logits = self.model(input_ids, cos, sin, meta, logits_at, override)
        scored = _split(prompt_rows, logits, n_sampled)
        return logits[:n_sampled], sampling, scored, _split(pooled_rows, hidden, 0)


def _split(wanted: list[tuple[Sequence, int, list[int]]], values, at: int) -> list:
    """(seq, first position, its rows of values) of each (seq, first position, flat rows),
    their rows in order from row `at` of values."""
    out = []
    for seq, first, rows in wanted:
        out.append((seq, first, values[at:at + len(rows)]))
        at += len(rows)
    return out


def _pad_tables(tables: list[list[int]], device) -> torch.Tensor:
    width = max(1, max(len(t) for t in tables))
    rows = [t + [0] * (width - len(t)) for t in tables]
    return torch.tensor(rows, dtype=torch.int32, device=device)
