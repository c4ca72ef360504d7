"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM): sigmoid router with score-correction bias and grouped
top-k, a shared expert, routed scaling, the first k layers dense; optional per-head q/k RMSNorm
and partial rotary in the half-split (not GLM-4's interleaved) layout."""

from __future__ import annotations


def glm4_moe_flags(cfg) -> dict:
    first_dense = int(getattr(cfg, "first_k_dense_replace", 0) or 0)
    experts, top_k = int(cfg.n_routed_experts), int(cfg.num_experts_per_tok)
    n_group = int(getattr(cfg, "n_group", 1) or 1)
    topk_group = int(getattr(cfg, "topk_group", 1) or 1)
    if experts % n_group or not 1 <= topk_group <= n_group or \
            top_k > topk_group * (experts // n_group) or experts // n_group < 2:
        raise ValueError(
            f"config.json: n_routed_experts={experts}, n_group={n_group}, topk_group={topk_group}, "
            f"num_experts_per_tok={top_k} do not make a grouped router: n_group must divide the "
            "experts into groups of 2 or more, topk_group be 1..n_group, and the chosen groups "
            "hold at least num_experts_per_tok experts")
    return dict(
        qkv_bias=bool(getattr(cfg, "attention_bias", False)), o_bias=False, mlp_bias=False,
        qk_norm=bool(getattr(cfg, "use_qk_norm", False)),
        moe=dict(scoring="sigmoid", num_experts=experts, n_group=n_group, topk_group=topk_group,
                 routed_scaling_factor=float(getattr(cfg, "routed_scaling_factor", 1.0)),
                 num_shared=int(getattr(cfg, "n_shared_experts", 0) or 0),
                 sparse=lambda i: i >= first_dense))
