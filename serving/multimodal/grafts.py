"""The grafts an engine serves, and the one loader that builds them: NAME -> encoder +
projector (a MultimodalFront each) over one frozen LLM, all checked to reference the same
LLM weights. A run dir served alone is a set of one (its graft is the default); a bare LLM
dir is a set of none.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from graft.errors import GraftConfigError
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
    """The grafts one engine serves: name -> MultimodalFront over the one LLM at llm_path."""

    def __init__(self, fronts: dict[str, MultimodalFront], runs: dict[str, GraftRun],
                 llm_path: Path, llm_sha256: str | None, tokenizer, cache: EncoderCache,
                 default: str | None = None):
        self.fronts = fronts
        self.runs = runs
        self.llm_path = llm_path  # the LLM the engine loaded (once)
        self.llm_sha256 = llm_sha256  # None for a bare LLM dir (nothing to check it against)
        self.tokenizer = tokenizer  # shared: every graft tokenizes with the one LLM's tokenizer
        self.cache = cache  # one byte budget for every graft's image embeddings
        self.default = default  # the graft a request naming none gets (a run dir served alone)

    @classmethod
    def empty(cls, llm_path: str | Path, tokenizer=None,
              cache_bytes: int = DEFAULT_CACHE_BYTES) -> "GraftSet":
        """No grafts: a bare LLM, text only."""
        return cls({}, {}, Path(llm_path), None, tokenizer, EncoderCache(cache_bytes))

    def front(self, name: str | None = None) -> MultimodalFront | None:
        """The named graft's front; with no name, the default graft's (None: text only)."""
        if name is None:
            return self.fronts[self.default] if self.default is not None else None
        return self[name]

    def __len__(self) -> int:
        return len(self.fronts)

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
        return list({id(f.image_path.encoder): f.image_path.encoder
                 for f in self.fronts.values()}.values())


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
        if run.has_lora and len(grafts) == 1:
            raise GraftConfigError(
                f"{run.lora_dir}: the serving engine runs the base LLM weights only; merge the "
                "LoRA into a copy of the LLM and point llm.path at it to serve this run")
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


def load_grafts(source: str | Path | dict[str, str | Path], llm: str | Path | None = None,
                cache_bytes: int = DEFAULT_CACHE_BYTES, device: str = "cpu") -> GraftSet:
    """The one loader: what an engine serves, from a bare LLM dir (no grafts), a run dir
    (one graft, the default) or {name: run dir} (several over one LLM, requests name theirs).
    Builds encoders, projectors and the LLM tokenizer, never the LLM weights; an encoder two
    grafts share (same config, or same identity()) is built once."""
    from transformers import AutoTokenizer

    from graft.encoders import build_encoder
    from graft.image_path import ImagePath, llm_width
    from graft.run_dir import model_dir_kind

    default = None
    if not isinstance(source, dict):
        if model_dir_kind(source) == "llm":  # neither a run dir nor an LLM dir: GraftConfigError
            return GraftSet.empty(source, cache_bytes=cache_bytes)
        name = re.sub(r"[^A-Za-z0-9._:/-]", "-", Path(source).resolve().name)
        default = name if _NAME.match(name) else "graft"  # internal: clients send --served-model-name
        source = {default: source}
    runs = read_runs(source)
    llm_path, sha = check_same_llm(runs, llm)
    tokenizer = AutoTokenizer.from_pretrained(str(llm_path))
    d_model = llm_width(str(llm_path))
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
        image_path = ImagePath.from_spec(run.spec, d_model, run.run_dir, encoder=by_config[key])
        fronts[run.name] = MultimodalFront(image_path.to(device), tokenizer, run.spec,
                                           run.run_dir, cache=cache)
    return GraftSet(fronts, {r.name: r for r in runs}, llm_path, sha, tokenizer, cache, default)
