"""Mixture-of-experts decoders (Qwen3-MoE, GLM-4.5) over the shared paged-attention engine.

A sparse layer is a fp32 router, routed experts (each a GatedMLP: the same quantized / C /
prepacked linears as a dense MLP) and optional shared experts. A step's (token, slot) pairs
are grouped by expert and each active expert runs once on its rows, so a batch-1 decode reads
only the top-k experts' weights. Op order follows transformers' grouped_mm experts forward
(weight each expert's rows, restore slot order, sum over the k slots) so greedy tokens match.
On the CPU with C-layout experts the whole block is one C call (kernels/csrc/moe_cpu.c, the
same order), which also lets the one-call decode step run MoE layers.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from graft.kernels import cpu_decode, cpu_quant, moe_grouped_gemm
from graft.serving.models.layers import GatedMLP, Linear
from graft.serving.models.llama import CausalLM, DecoderLayer


class TopKRouter(nn.Module):
    """Expert choice per token. softmax: Qwen3-MoE (softmax over all experts, top-k).
    sigmoid: GLM-4.5 / DeepSeek-V3 (sigmoid scores, a score-correction bias that only steers
    the choice, top-k within the best `topk_group` of `n_group` expert groups, weights scaled by
    `routed_scaling_factor`)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, scoring: str,
                 norm_topk_prob: bool, n_group: int = 1, topk_group: int = 1,
                 routed_scaling_factor: float = 1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden), requires_grad=False)
        self.e_score_correction_bias = (nn.Parameter(torch.empty(num_experts), requires_grad=False)
                                        if scoring == "sigmoid" else None)
        self.num_experts, self.top_k, self.scoring = num_experts, top_k, scoring
        self.norm_topk_prob = norm_topk_prob
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor

    def _apply(self, fn, recurse=True):
        # The router stays fp32 whatever the engine's dtype (HF keeps GLM's gate in fp32 too):
        # routing in bf16 flips near-tied expert choices. Re-cast after every .to()/to_empty().
        super()._apply(fn, recurse)
        for param in self.parameters(recurse=False):
            if param.is_floating_point() and param.dtype != torch.float32:
                param.data = param.data.float()
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (routing weights [T, k] fp32, expert ids [T, k] int64)."""
        logits = F.linear(x.float(), self.weight)  # [T, E]
        if self.scoring == "softmax":
            weights, ids = logits.softmax(dim=-1).topk(self.top_k, dim=-1)
            if self.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return weights, ids
        scores = logits.sigmoid()
        choice = scores + self.e_score_correction_bias  # [T, E]
        per_group = self.num_experts // self.n_group
        group_scores = choice.view(-1, self.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        best_groups = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]  # [T, topk_group]
        group_mask = torch.zeros_like(group_scores).scatter_(1, best_groups, 1.0).bool()
        expert_mask = group_mask.unsqueeze(-1).expand(-1, self.n_group, per_group).reshape(
            -1, self.num_experts)
        ids = choice.masked_fill(~expert_mask, float("-inf")).topk(
            self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, ids


class MoEBlock(nn.Module):
    """Routed experts (+ shared experts): the MLP of a sparse decoder layer."""

    def __init__(self, hidden: int, moe_intermediate: int, act: str, router: TopKRouter,
                 num_shared: int = 0):
        super().__init__()
        self.gate = router
        self.experts = nn.ModuleList(GatedMLP(hidden, moe_intermediate, act)
                                     for _ in range(router.num_experts))
        self.shared_experts = (GatedMLP(hidden, moe_intermediate * num_shared, act)
                               if num_shared else None)
        self._stacked = None  # the grouped GEMM's stacked expert weights, built on first use
        self._c_desc = None  # (the packed weight it points at, the C descriptor, what it points at)
        self._c_scratch = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        desc = self.c_desc() if x.dtype == torch.float32 and x.device.type == "cpu" else None
        if desc is not None:  # router, experts and shared experts in one C call
            out, self._c_scratch = cpu_decode.moe_block(desc, x.contiguous(), self._c_scratch)
            return out
        T, H = x.shape
        weights, ids = self.gate(x)  # [T, k]
        k = ids.shape[1]
        grouped = self._use_grouped_gemm(x)
        if T == 1 and not grouped:
            out = self._one_token(x, weights, ids)
        else:
            out = self._by_expert(x, weights, ids, grouped)
        routed = out.view(T, k, H).sum(dim=1).to(x.dtype)  # [T, H]
        if self.shared_experts is not None:
            routed = routed + self.shared_experts(x)
        return routed

    def _one_token(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Batch-1 decode: the token's k experts in slot order, no sort or scatter (the same
        products as _by_expert, so a token's output does not depend on its batch)."""
        out = torch.empty(ids.shape[1], x.shape[1], dtype=torch.float32, device=x.device)
        for slot, expert in enumerate(ids[0].tolist()):
            # a [1] weight, not a 0-dim one: bf16 * 0-dim fp32 would stay bf16
            out[slot] = self.experts[expert](x)[0] * weights[0, slot:slot + 1]
        return out

    def _by_expert(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                   grouped: bool) -> torch.Tensor:
        """[T k, H] fp32 slot outputs (slot s = token s // k, its (s % k)-th choice), each
        active expert run once on its rows: one gather, contiguous row ranges per expert, one
        scatter back to slot order."""
        k = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, tokens in order
        counts = torch.bincount(flat, minlength=len(self.experts))  # [E]
        xs = x[order // k]  # [T k, H]: each expert's rows one contiguous range
        slot_weights = weights.reshape(-1)[order].unsqueeze(-1)  # [T k, 1] fp32
        if grouped:
            ys = self._grouped(xs, counts) * slot_weights
        else:
            ys = torch.empty(xs.shape, dtype=torch.float32, device=x.device)
            start = 0
            for expert, n in enumerate(counts.tolist()):
                if n:  # an inactive expert is never touched: its weights are not read
                    rows = slice(start, start + n)
                    ys[rows] = self.experts[expert](xs[rows]) * slot_weights[rows]
                    start += n
        return torch.empty_like(ys).index_copy_(0, order, ys)

    def c_desc(self):
        """The C descriptor of this block (kernels/csrc/moe_cpu.c) when one C call can run it:
        the experts and shared experts are the engine's C linears (any quantization config)
        with silu, and the C kernels are asked for; else None. Rebuilt when the packed weights
        move (they go to huge pages on load)."""
        from graft.kernels.dispatch import kernels_mode

        first = self.experts[0].gate_up_proj.quantized
        probe = self.gate.weight
        if (first is None or kernels_mode() not in ("auto", "cpu")
                or not cpu_quant.supports(probe, first)):
            return None
        packed = first.packed.get("cpu")  # packed on first use
        if self._c_desc is None or packed is None or self._c_desc[0] != packed.weight.data_ptr():
            mlps = [*self.experts, *([self.shared_experts] if self.shared_experts is not None else [])]
            if not all(m.is_silu and lin.quantized is not None and cpu_quant.supports(probe, lin.quantized)
                       for m in mlps for lin in (m.gate_up_proj, m.down_proj)):
                return None
            keep = []
            desc = cpu_decode.moe_desc(self, keep)
            self._c_desc = (first.packed["cpu"].weight.data_ptr(), desc, keep)
        return self._c_desc[1]

    def _use_grouped_gemm(self, x: torch.Tensor) -> bool:
        """The Triton grouped GEMM (GPU, or GRAFT_KERNELS=triton under the interpreter) takes
        float experts; quantized ones and the CPU path run each expert's own linears."""
        from graft.kernels.dispatch import implementation, reference

        return implementation(x) is not reference and all(
            lin.quantized is None and lin.prepacked is None
            for e in self.experts for lin in (e.gate_up_proj, e.down_proj))

    def _grouped(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Every expert's MLP on its rows of xs [S, H] (grouped by expert) in two launches."""
        if self._stacked is None:
            # [E, 2I, H] and [E, H, I]; each expert's weights become views of them (one copy)
            self._stacked = tuple(torch.stack([getattr(e, name).weight.detach() for e in self.experts])
                                  for name in ("gate_up_proj", "down_proj"))
            for i, e in enumerate(self.experts):
                e.gate_up_proj.weight = nn.Parameter(self._stacked[0][i], requires_grad=False)
                e.down_proj.weight = nn.Parameter(self._stacked[1][i], requires_grad=False)
        offsets = F.pad(torch.cumsum(counts, 0), (1, 0))  # [E + 1]
        h = self.experts[0].activate(moe_grouped_gemm(xs, self._stacked[0], offsets))  # [S, I]
        return moe_grouped_gemm(h, self._stacked[1], offsets)  # [S, H]

    def expert_read_bytes(self, linear_bytes) -> int:
        """Bytes of all routed experts' weights, with linear_bytes(Linear) per matmul."""
        return sum(linear_bytes(m) for m in self.experts.modules() if isinstance(m, Linear))


class MoeDecoderLayer(DecoderLayer):
    """A decoder layer whose MLP is an MoEBlock (the dense layer's forward)."""

    def __init__(self, cfg, flags: dict):
        super().__init__(cfg, flags)
        moe = flags["moe"]
        router = TopKRouter(cfg.hidden_size, moe["num_experts"], cfg.num_experts_per_tok,
                            moe["scoring"], bool(cfg.norm_topk_prob), moe.get("n_group", 1),
                            moe.get("topk_group", 1), moe.get("routed_scaling_factor", 1.0))
        self.mlp = MoEBlock(cfg.hidden_size, cfg.moe_intermediate_size, cfg.hidden_act, router,
                            moe.get("num_shared", 0))


class MoeCausalLM(CausalLM):
    """CausalLM whose layers flags["moe"]["sparse"](index) picks are MoeDecoderLayers; the
    others stay dense (GLM-4.5's first_k_dense_replace, Qwen3-MoE's mlp_only_layers)."""

    # the step's expert counts decide which experts run (read on the host): not capturable
    graph_unsafe_reason = "MoE layers pick their experts on the host"

    def build_layer(self, cfg, flags: dict, index: int) -> nn.Module:
        if flags["moe"]["sparse"](index):
            return MoeDecoderLayer(cfg, flags)
        return DecoderLayer(cfg, flags)

    def moe_blocks(self) -> list[MoEBlock]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoEBlock)]

    def weight_bytes_per_token(self, batch_size: int = 1) -> int:
        """Bytes of linear weights one decode step of `batch_size` tokens reads: every dense
        weight once, and of each sparse layer's experts the expected number of distinct ones
        the batch activates under uniform routing, E (1 - (1 - k/E)^B) (k at batch 1): the
        active-parameter roofline."""
        total = super().weight_bytes_per_token()
        for block in self.moe_blocks():
            n, k = len(block.experts), block.gate.top_k
            active = n * (1.0 - (1.0 - k / n) ** batch_size)
            total -= round(block.expert_read_bytes(self.linear_read_bytes) * (1.0 - active / n))
        return total
