"""Module groups (the units the search assigns a scheme to) and assignments <-> quant.json.

A group is a set of the engine's linears: one module, the attention or the MLP of one layer or
of a block of consecutive layers, or the output head. In MoE layers the routed experts and the
shared experts are groups of their own (`layers.3.experts`, `layers.3.shared_experts`), never
split per expert, even at module granularity; the router is not a linear of the plan (it stays
fp32). An assignment maps every group to a
scheme name; its plan maps every linear to a QuantScheme, as the engine takes it.
"""

from __future__ import annotations

import re
from collections import Counter

from graft.errors import GraftConfigError

GRANULARITIES = "module | layer | block:N | auto"
_LAYER = re.compile(r"^layers\.(\d+)\.(self_attn|mlp)\.(?:((?:shared_)?experts)\.)?")


def parse_granularity(text: str, num_layers: int) -> int:
    """Layers per group: 0 = one group per module, else N consecutive layers per group.
    auto: three blocks, so the default search fits ~15 minutes on a small model (docs)."""
    value = str(text).strip().lower()
    if value == "module":
        return 0
    if value == "layer":
        return 1
    if value == "auto":
        return max(1, -(-num_layers // 3))
    if value.startswith("block:") and value[6:].isdigit() and int(value[6:]) > 0:
        return int(value[6:])
    raise GraftConfigError(f"--granularity {text!r} is not valid; use {GRANULARITIES}")


def module_groups(module_names: list[str], layers_per_group: int) -> dict[str, list[str]]:
    """Group name -> module names, in model order. Names: `lm_head`, `layers.0-9.mlp`,
    `layers.3.self_attn`, `layers.3.experts` (layer), or the module name itself (module
    granularity; a layer's routed or shared experts stay one group)."""
    groups: dict[str, list[str]] = {}
    num_layers = 1 + max([int(m.group(1)) for n in module_names if (m := _LAYER.match(n))], default=-1)
    for name in module_names:
        match = _LAYER.match(name)
        part = match and (match.group(3) or match.group(2))
        if match is None or (layers_per_group == 0 and not match.group(3)):
            key = name
        else:
            per = layers_per_group or 1
            lo = int(match.group(1)) // per * per
            hi = min(lo + per, num_layers) - 1
            span = str(lo) if lo == hi else f"{lo}-{hi}"
            key = f"layers.{span}.{part}"
        groups.setdefault(key, []).append(name)
    return groups


def assignment_key(assignment: dict[str, str], groups: list[str]) -> str:
    """A stable name: the groups not in fp32 with their schemes (`fp32` when none is)."""
    parts = [f"{g}={assignment[g]}" for g in groups if assignment.get(g, "fp32") != "fp32"]
    return ",".join(parts) or "fp32"


def to_plan(assignment: dict[str, str], groups: dict[str, list[str]]) -> dict:
    """{module name: QuantScheme} for the engine."""
    from graft.kernels.quant_formats import QuantScheme

    return {module: QuantScheme.parse(assignment.get(g, "fp32"))
            for g, modules in groups.items() for module in modules}


def to_quant_config(assignment: dict[str, str], groups: dict[str, list[str]],
                    comment: str = "") -> dict:
    """The quant.json dict: the commonest scheme as default, every other module by name."""
    per_module = {m: assignment.get(g, "fp32") for g, modules in groups.items() for m in modules}
    default = Counter(per_module.values()).most_common(1)[0][0]
    out = {"format": "graft-quant/1", "default": default,
           "modules": {m: s for m, s in per_module.items() if s != default}}
    if comment:
        out["comment"] = comment
    return out
