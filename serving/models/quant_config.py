"""How each frozen LLM linear is held in memory: the quantization config and its plan.

A config is one scheme for every linear (`"int8"`) or a JSON file (what `graft quantize`
writes):

    {"default": "int8", "modules": {"lm_head": "fp32", "layers.0.*": "int4-g64"}}

`modules` maps module names or fnmatch patterns to schemes; the first pattern that matches a
module wins, `default` (fp32 when absent) covers the rest. Module names are the engine's:
`layers.N.self_attn.qkv_proj` (q|k|v as one matmul), `layers.N.self_attn.o_proj`,
`layers.N.mlp.gate_up_proj`, `layers.N.mlp.down_proj` and `lm_head` (for tied embeddings a
quantized copy of the table). The embedding table's lookups keep it as loaded unless a rule
names `embed_tokens` itself (no pattern or default reaches it): then the table is held in that
scheme (fp32, bf16, int8, int8-gG or int4-gG) and each looked-up row is dequantized. MoE layers have
`layers.N.mlp.experts.E.gate_up_proj` / `.down_proj` per routed expert and
`layers.N.mlp.shared_experts.*`; their router (`layers.N.mlp.gate`) is not a linear of the
plan: it always stays fp32. The checkpoint on disk is
never modified: weights are quantized at load time.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from graft.errors import GraftConfigError
from graft.kernels.quant_formats import QuantScheme, QuantSchemeError, SCHEME_NAMES

FORMAT = "graft-quant/1"
FP32 = QuantScheme("fp32")
EMBEDDING = "embed_tokens"  # the plan's name of the input embedding table (not a linear)


@dataclass
class QuantConfig:
    default: QuantScheme = FP32
    rules: list[tuple[str, QuantScheme]] = field(default_factory=list)  # (pattern, scheme), in order
    source: str = ""  # the scheme name or file it came from, for logs and errors

    @classmethod
    def parse(cls, value: "str | Path | dict | QuantConfig | None") -> "QuantConfig | None":
        """None or "none" (no config: the model's own linears), a scheme name, a path to a
        JSON config, or the JSON as a dict."""
        if value is None or isinstance(value, QuantConfig):
            return value
        if isinstance(value, str) and value.strip().lower() == "none":
            return None
        if isinstance(value, dict):
            return cls._from_dict(value, "quantization")
        text = str(value).strip()
        if text.lower() in SCHEME_NAMES:
            return cls(QuantScheme.parse(text), [], text.lower())
        path = Path(text).expanduser()
        if path.suffix != ".json" and not path.is_file():
            raise GraftConfigError(f"quantization={text!r} is neither a scheme ({', '.join(SCHEME_NAMES)}), "
                                   "none, nor a quantization config file (.json)")
        if not path.is_file():
            raise GraftConfigError(f"quantization config {path} does not exist; write one with "
                                   "`graft quantize` or give a scheme name")
        from graft.loads import json_loads

        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise GraftConfigError(f"quantization config {path} is not readable: {err}") from None
        data = json_loads(text, f"quantization config {path}")
        return cls._from_dict(data, str(path))

    @classmethod
    def _from_dict(cls, data, where: str) -> "QuantConfig":
        if not isinstance(data, dict):
            raise GraftConfigError(f"{where}: a quantization config is a JSON object with "
                                   "'default' and 'modules'")
        unknown = set(data) - {"format", "default", "modules", "comment"}
        if unknown:
            raise GraftConfigError(f"{where}: unknown key(s) {sorted(unknown)}; valid: format, "
                                   "default, modules, comment")
        if "format" in data and data["format"] != FORMAT:  # hand-written configs may omit it
            raise GraftConfigError(f"{where}: format {data['format']!r} is not supported; this "
                                   f"graft reads {FORMAT!r} (rewrite it with `graft quantize` "
                                   "or drop the 'format' key from a hand-written config)")
        modules = data.get("modules", {})
        if not isinstance(modules, dict):
            raise GraftConfigError(f"{where}: 'modules' must map module names or patterns to schemes")
        try:
            default = QuantScheme.parse(data.get("default", "fp32"), where=f"{where}: default")
            rules = [(str(pattern), QuantScheme.parse(scheme, where=f"{where}: modules[{pattern!r}]"))
                     for pattern, scheme in modules.items()]
        except QuantSchemeError as err:
            raise GraftConfigError(str(err)) from None
        return cls(default, rules, where)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "default": self.default.name,
                "modules": {pattern: scheme.name for pattern, scheme in self.rules}}

    def scheme_for(self, name: str) -> QuantScheme:
        for pattern, scheme in self.rules:
            if fnmatch.fnmatchcase(name, pattern):
                return scheme
        return self.default

    def plan(self, shapes: dict[str, tuple[int, int]],
             embedding: tuple[int, int] | None = None) -> dict[str, QuantScheme]:
        """Module name -> scheme for every quantizable linear ({name: (out, in)}), checked:
        every pattern matches something and every scheme fits its module's shape; plus
        EMBEDDING when a rule names it and `embedding` ((vocab, hidden)) is given."""
        for pattern, _ in self.rules:
            if not (any(fnmatch.fnmatchcase(name, pattern) for name in shapes)
                    or pattern == EMBEDDING and embedding is not None):
                examples = ", ".join(list(shapes)[:4])
                raise GraftConfigError(f"{self.source}: modules pattern {pattern!r} matches no linear "
                                       f"of this model; names look like {examples}, lm_head, {EMBEDDING}")
        plan = {name: self.scheme_for(name) for name in shapes}
        shapes = dict(shapes)
        for pattern, scheme in self.rules:
            if pattern == EMBEDDING and embedding is not None and EMBEDDING not in plan:
                if scheme.act8:
                    raise GraftConfigError(f"{self.source}: {EMBEDDING}: {scheme.name} rounds a linear's "
                                           f"input, which a table has not; use {scheme.name[:-3]}")
                plan[EMBEDDING], shapes[EMBEDDING] = scheme, embedding
        try:
            for name, scheme in plan.items():
                scheme.check_shape(*shapes[name], where=f"{self.source}: {name}")
        except QuantSchemeError as err:
            raise GraftConfigError(str(err)) from None
        return plan

    def describe(self, plan: dict[str, QuantScheme]) -> str:
        """'int8 x 120, fp32 x 1' (and ', embedding int8') for logs."""
        text = ", ".join(f"{name} x {n}" for name, n in sorted(scheme_counts(plan).items()))
        return text + (f", embedding {plan[EMBEDDING].name}" if EMBEDDING in plan else "")


def scheme_counts(plan: dict[str, QuantScheme]) -> dict[str, int]:
    """How many linears a plan holds in each scheme: {"int8": 120, "fp32": 1} (the embedding
    table, not a linear, is not counted)."""
    counts: dict[str, int] = {}
    for name, scheme in plan.items():
        if name != EMBEDDING:
            counts[scheme.name] = counts.get(scheme.name, 0) + 1
    return counts


def linear_shapes(model: nn.Module) -> dict[str, tuple[int, int]]:
    """{module name: (out, in)} of every linear the engine can quantize (works on meta models)."""
    from graft.serving.models.layers import Linear

    shapes = {name: (m.out_features, m.in_features) for name, m in model.named_modules()
              if isinstance(m, Linear)}
    if getattr(model, "lm_head", None) is None:  # tied: the head multiplies by the table
        shapes["lm_head"] = tuple(model.embed_tokens.weight.shape)
    return shapes


_HF_PACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
              "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


def engine_module_name(hf_name: str) -> str:
    """HF module name (model.layers.0.self_attn.q_proj) -> the engine's (layers.0.self_attn.qkv_proj)."""
    parts = hf_name.split(".")
    if parts[0] == "model":
        parts = parts[1:]
    if parts and parts[-1] in _HF_PACKED:
        parts[-1] = _HF_PACKED[parts[-1]]
    return ".".join(parts)


def dequantize_hf_model(hf_model: nn.Module, plan: dict[str, QuantScheme]) -> nn.Module:
    """Replace, in place, each Linear weight of an HF causal LM by its dequantized value under
    `plan` (the engine's plan for the same checkpoint): the reference a quantized engine must
    match. Quantization is per output row, so q/k/v (gate/up) quantized apart equal the
    engine's stacked matrix. A tied head gets its own dequantized copy; the input embedding
    is dequantized only where the plan names EMBEDDING (then a tied head keeps its own). A linear of an -a8 scheme also rounds its input as the engine does (a forward pre-hook,
    graft.kernels.quant_formats.round_activations)."""
    import torch
    from graft.kernels.quant_formats import quantize, round_activations

    def rounded_input(_module, args):
        return (round_activations(args[0]).to(args[0].dtype), *args[1:])

    for name, module in hf_model.named_modules():
        if isinstance(getattr(module, "gate_up_proj", None), nn.Parameter):
            _dequantize_fused_experts(name, module, plan)
            continue
        if not isinstance(module, nn.Linear):
            continue
        scheme = plan.get(engine_module_name(name))
        if scheme is None:
            raise GraftConfigError(f"HF module {name!r} has no entry in the engine's plan; "
                                   "is it the same checkpoint?")
        if scheme.kind != "fp32":
            with torch.no_grad():
                deq = quantize(module.weight, scheme).dequantize().to(module.weight.dtype)
            module.weight = nn.Parameter(deq, requires_grad=False)  # unties a tied head
        if scheme.act8:
            module.register_forward_pre_hook(rounded_input)
    if EMBEDDING in plan and plan[EMBEDDING].kind != "fp32":
        table = hf_model.get_input_embeddings()
        with torch.no_grad():
            deq = quantize(table.weight, plan[EMBEDDING]).dequantize().to(table.weight.dtype)
        table.weight = nn.Parameter(deq, requires_grad=False)  # a tied fp32 head keeps the old one
    return hf_model


def _dequantize_fused_experts(name: str, module: nn.Module, plan: dict[str, QuantScheme]) -> None:
    """transformers 5 holds a layer's routed experts as 3-D parameters gate_up_proj [E, 2I, H]
    and down_proj [E, H, I] ([E, in, out] when is_transposed); the engine holds expert e as
    linears `<layer>.mlp.experts.e.gate_up_proj` / `.down_proj`: dequantize slice e by their plan."""
    import torch
    from graft.kernels.quant_formats import quantize

    base = engine_module_name(name)
    transposed = bool(getattr(module, "is_transposed", False))
    for pname in ("gate_up_proj", "down_proj"):
        param = getattr(module, pname)
        deq = param.detach().clone()
        for e in range(param.shape[0]):
            scheme = plan.get(f"{base}.{e}.{pname}")
            if scheme is None:
                raise GraftConfigError(f"HF experts {name!r} have no entry {base}.{e}.{pname} in "
                                       "the engine's plan; is it the same checkpoint?")
            if scheme.kind == "fp32":
                continue
            if scheme.act8:
                raise GraftConfigError(f"{base}.{e}.{pname}: the HF reference rounds the inputs of "
                                       f"{scheme.name} only on plain linears, not on fused experts")
            weight = param[e].t() if transposed else param[e]  # [out, in]
            with torch.no_grad():
                value = quantize(weight, scheme).dequantize().to(param.dtype)
                deq[e] = value.t() if transposed else value
        setattr(module, pname, nn.Parameter(deq, requires_grad=False))


def changes_weights(plan: dict[str, QuantScheme], dtype: torch.dtype) -> bool:
    """Whether the plan holds any linear in values other than the engine's own weights in
    `dtype`: `fp32` keeps every engine's weights as loaded, `bf16` a bf16 engine's. Results
    under a plan that does are cached under their own keys (plan_digest)."""
    as_loaded = {"fp32", "bf16"} if dtype == torch.bfloat16 else {"fp32"}
    return any(s.kind not in as_loaded for s in plan.values())


def plan_digest(plan: dict[str, QuantScheme]) -> str:
    """A short stable digest of a plan (which scheme each module has): cache keys of results."""
    import hashlib

    text = json.dumps({name: s.name for name, s in sorted(plan.items())}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
