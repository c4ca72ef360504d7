"""What the search measures per assignment, on the real engine: weight bytes, decode tokens/s,
end-to-end quality on the search split, and KL on the calibration set."""

from __future__ import annotations

from dataclasses import dataclass

from graft.errors import GraftConfigError


@dataclass
class EvalSettings:
    granularity: str = "auto"  # module | layer | block:N | auto (three blocks of layers)
    schemes: tuple = ("fp32", "bf16", "int8", "int4")  # fp32 is always the first level
    heldout_fraction: float = 0.5  # share of each task's questions kept out of the search
    split_seed: int = 0  # which questions land on which side
    limit: int | None = None  # first N questions per task (before the split)
    n_chunks: int = 4  # scoring rounds per candidate (early stopping between them)
    decode_tokens: int = 32  # tokens per throughput run
    decode_repeats: int = 2  # throughput runs per candidate (the faster kept)
    calibration: str | None = None  # text/JSONL/JSON file; None: the run's training data
    calibration_samples: int = 16  # sequences for KL
    calibration_tokens: int = 256  # tokens per sequence at most


def parse_schemes(text) -> list[str]:
    """Scheme names ordered from most to least bytes per weight, fp32 first."""
    from graft.kernels.quant_formats import QuantScheme, QuantSchemeError

    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    try:
        schemes = {QuantScheme.parse(n, where="--schemes").name: QuantScheme.parse(n) for n in names}
    except QuantSchemeError as err:
        raise GraftConfigError(str(err)) from None
    schemes.setdefault("fp32", QuantScheme("fp32"))
    return sorted(schemes, key=lambda n: -schemes[n].bytes_per_weight())


class Evaluator:
    def __init__(self, qe, splits, settings: EvalSettings):
        from graft.quantize.calibration import KLMeter, load_calibration
        from graft.quantize.groups import module_groups, parse_granularity, to_plan
        from graft.quantize.quality import QualityMeter, fill_references

        self.qe, self.splits, self.settings = qe, splits, settings
        self.schemes = parse_schemes(settings.schemes)
        n_layers = len(qe.model.layers)
        self.modules = module_groups(list(qe.shapes), parse_granularity(settings.granularity, n_layers))
        self.groups = list(self.modules)
        self._check_fits()
        fp32_plan = to_plan({}, self.modules)
        fill_references(splits, qe.plan_backend(fp32_plan))
        seqs = load_calibration(qe, settings.calibration, settings.calibration_samples,
                                settings.calibration_tokens)
        self.kl = KLMeter(qe, seqs, fp32_plan)
        self.quality = QualityMeter(splits, settings.n_chunks)
        from graft.kernels.quant_formats import QuantScheme

        self._bytes = {(g, s): sum(qe.module_bytes(m, QuantScheme.parse(s)) for m in ms)
                       for g, ms in self.modules.items() for s in self.schemes}

    def _check_fits(self) -> None:
        """A scheme that does not fit some module (int4 group size vs width) fails now."""
        from graft.serving.models.quant_config import QuantConfig

        for s in self.schemes:
            QuantConfig.parse(s).plan(self.qe.shapes)

    def plan(self, assignment: dict) -> dict:
        from graft.quantize.groups import to_plan

        return to_plan(assignment, self.modules)

    def group_bytes(self, group: str, scheme: str) -> int:
        return self._bytes[(group, scheme)]

    def weight_bytes(self, assignment: dict) -> int:
        return sum(self._bytes[(g, assignment.get(g, "fp32"))] for g in self.groups)

    def tokens_per_s(self, assignment: dict) -> float:
        """Decode tokens/s of `assignment` alone (no quality): a re-measurement."""
        self.qe.apply(self.plan(assignment))
        return self.qe.decode_tokens_per_s(self.settings.decode_tokens, self.settings.decode_repeats)

    def measure(self, assignment: dict, stop=None) -> dict:
        """Bytes and tokens/s first (cheap), then quality chunk by chunk (`stop(upper bound,
        tokens/s, bytes)` may end it), then KL for a complete one."""
        plan = self.plan(assignment)
        self.qe.apply(plan)
        nbytes = self.qe.model.weight_bytes_per_token()
        tps = self.qe.decode_tokens_per_s(self.settings.decode_tokens, self.settings.decode_repeats)
        rule = None if stop is None else (lambda ub: stop(ub, tps, nbytes))
        result = self.quality(self.qe.plan_backend(plan), rule)
        result["kl"] = self.kl(plan) if result["complete"] else None
        return {**result, "tokens_per_s": tps, "weight_bytes": nbytes}
