"""Several grafts over one frozen LLM: NAME -> encoder + projector (a MultimodalFront each),
all checked to reference the same LLM weights, served by one engine with one KV pool.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from graft.errors import GraftConfigError
from graft.model import GraftedModel
from graft.serving.multimodal.encoder_cache import EncoderCache
from graft.serving.multimodal.front import DEFAULT_CACHE_BYTES, MultimodalFront

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
# files that decide how text becomes token ids (the weights digest does not cover them)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja", "tokenizer.model", "vocab.json", "merges.txt")


@dataclass
class GraftRun:
    """One run dir as its graft.yaml describes it, read before anything heavy loads."""

    name: str  # the `model` clients send to pick this graft
    run_dir: Path
    spec: object  # GraftSpec
    llm_path: Path  # resolved spec.llm.path
    llm_sha256: str  # recorded at training, or computed now where graft.yaml has none
    recorded: bool  # whether llm_sha256 came from graft.yaml


class GraftSet:
    """The grafts one engine serves: name -> MultimodalFront, plus the bare LLM's name."""

    def __init__(self, fronts: dict[str, MultimodalFront], runs: dict[str, GraftRun],
                 llm_path: Path, llm_sha256: str, tokenizer, cache: EncoderCache):
        self.fronts = fronts
        self.runs = runs
        self.llm_path = llm_path  # the LLM the engine loaded (once)
        self.llm_sha256 = llm_sha256
        self.tokenizer = tokenizer  # shared: every graft tokenizes with the one LLM's tokenizer
        self.cache = cache  # one byte budget for every graft's image embeddings

    def __getitem__(self, name: str) -> MultimodalFront:
        if name not in self.fronts:
            raise KeyError(f"no graft named {name!r}; grafts: {', '.join(self.fronts)}")
        return self.fronts[name]

    def __contains__(self, name: str) -> bool:
        return name in self.fronts

    def __iter__(self):
        return iter(self.fronts)

    @property
    def names(self) -> list[str]:
        return list(self.fronts)

    def encoders(self) -> list:
        """Distinct encoder modules (one per identity, however many grafts use it)."""
        return list({id(f.model.encoder): f.model.encoder for f in self.fronts.values()}.values())


def parse_graft_arg(text: str) -> tuple[str, str]:
    """`NAME=RUN_DIR` (the --graft option) -> (name, run dir)."""
    name, sep, path = text.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not path:
        raise GraftConfigError(f"--graft {text!r}: expected NAME=RUN_DIR, e.g. siglip=runs/siglip")
    check_name(name, f"--graft {text!r}")
    return name, path


def check_name(name: str, where: str) -> None:
    if not _NAME.match(name):
        raise GraftConfigError(f"{where}: graft name {name!r} must start with a letter or digit "
                               "and hold only letters, digits and . _ : / -")


def read_runs(grafts: dict[str, str | Path]) -> list[GraftRun]:
    """GraftRun per (name, run dir); a dir that is not a run dir or a LoRA run is refused here."""
    from graft.io import weights_sha256
    from graft.run_dir import RunDir
    from graft.spec import GraftSpec

    if not grafts:
        raise GraftConfigError("no grafts given: pass at least one NAME=RUN_DIR")
    computed: dict[Path, str] = {}
    runs = []
    for name, run_dir in grafts.items():
        check_name(name, f"graft {name!r}")
        run = RunDir.open(run_dir, what=f"graft {name!r}: ")
        run_dir = run.path
        if run.has_lora:
            raise GraftConfigError(
                f"graft {name!r}: {run.lora_dir} changes the LLM, so it cannot share one frozen "
                "LLM with other grafts; merge the LoRA into a copy of the LLM and serve it alone")
        spec = run.load_spec()
        llm_path = Path(GraftSpec.expand(spec.llm.path)).resolve()
        sha = spec.llm.sha256
        if not sha:
            if llm_path not in computed:
                computed[llm_path] = weights_sha256(llm_path)
            sha = computed[llm_path]
        runs.append(GraftRun(name, run_dir, spec, llm_path, sha, bool(spec.llm.sha256)))
    return runs


def check_same_llm(runs: list[GraftRun], llm: str | Path | None = None) -> tuple[Path, str]:
    """(LLM dir to load, its weights digest): every run must have been trained on exactly
    these weights; a mismatch names both sides and both digests."""
    from graft.io import weights_sha256

    ref = runs[0]
    for run in runs[1:]:
        if run.llm_sha256 != ref.llm_sha256:
            raise GraftConfigError(
                f"grafts {ref.name!r} ({ref.run_dir}) and {run.name!r} ({run.run_dir}) use "
                f"different LLMs: llm.sha256 {ref.llm_sha256} ({ref.llm_path}) vs "
                f"{run.llm_sha256} ({run.llm_path}); grafts share one frozen LLM, so serve "
                "these from separate servers or retrain one on the other's LLM")
    path = Path(llm).resolve() if llm is not None else ref.llm_path
    # a digest read_runs already computed from this very dir need not be hashed again
    actual = next((r.llm_sha256 for r in runs if not r.recorded and r.llm_path == path),
                  None) or weights_sha256(path)
    for run in runs:
        if run.llm_sha256 != actual:
            how = "recorded at training" if run.recorded else "computed from its llm.path"
            raise GraftConfigError(
                f"graft {run.name!r} ({run.run_dir}) has llm.sha256 {run.llm_sha256} ({how}, "
                f"{run.llm_path}) but the LLM dir {path} hashes to {actual}; the weights "
                "changed since training, or the LLM dir is another model")
    tokenizers = {_tokenizer_digest(p): p for p in {path, *(r.llm_path for r in runs)}}
    if len(tokenizers) > 1:
        a, b = list(tokenizers.values())[:2]
        raise GraftConfigError(
            f"LLM dirs {a} and {b} hold the same weights but different tokenizer files; every "
            "graft must tokenize as it did in training: point llm.path at one copy")
    return path, actual


def _tokenizer_digest(llm_dir: Path) -> str:
    h = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        p = llm_dir / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def load_grafts(grafts: dict[str, str | Path], llm: str | Path | None = None,
                cache_bytes: int = DEFAULT_CACHE_BYTES, device: str = "cpu") -> GraftSet:
    """Encoders, projectors and the LLM tokenizer of every graft (never the LLM weights).
    An encoder two grafts share (same config, or same identity()) is built once."""
    from transformers import AutoTokenizer

    from graft.encoders import build_encoder

    runs = read_runs(grafts)
    llm_path, sha = check_same_llm(runs, llm)
    tokenizer = AutoTokenizer.from_pretrained(str(llm_path))
    cache = EncoderCache(cache_bytes)
    by_config: dict[str, object] = {}
    by_identity: dict[str, object] = {}
    fronts: dict[str, MultimodalFront] = {}
    for run in runs:
        cfg = run.spec.encoder_config()
        if cfg.path:
            cfg.path = str(Path(cfg.path).resolve())
        key = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
        if key not in by_config:
            encoder = build_encoder(cfg).to(device)
            by_config[key] = by_identity.setdefault(encoder.identity(), encoder)
        # image path only (the engine holds the one LLM), sharing encoder and tokenizer
        model = GraftedModel.from_spec(run.spec, adapter_dir=run.run_dir, with_llm=False,
                                       encoder=by_config[key], tokenizer=tokenizer).to(device)
        fronts[run.name] = MultimodalFront(model, run.run_dir, cache=cache)
    return GraftSet(fronts, {r.name: r for r in runs}, llm_path, sha, tokenizer, cache)


def load_engine_with_grafts(grafts: dict[str, str | Path], config=None, llm: str | Path | None = None,
                            cache_bytes: int = DEFAULT_CACHE_BYTES, **kwargs):
    """One Engine (one LLM copy, one KV pool) with `engine.grafts` = every graft's front.
    `Engine.from_grafts` delegates here."""
    from graft.serving.engine.engine import Engine

    graft_set = load_grafts(grafts, llm, cache_bytes, device=getattr(config, "device", "cpu"))
    kwargs.setdefault("tokenizer", graft_set.tokenizer)
    engine = Engine(graft_set.llm_path, config, **kwargs)
    engine.grafts = graft_set
    engine.mm = None  # no single default graft: each request names its graft
    return engine
