"""A GGUF file (llama.cpp's format) as an LLM dir every graft command takes: config.json, the
tokenizer and generation_config.json as transformers reads them from the file's metadata,
the file itself linked as model.gguf (never copied, never dequantized on disk), and
gguf.json: each weight's GGUF type, from which the engine keeps Q4_0/Q4_1 linears in int4
exactly (graft.serving.models.gguf_weights). Made once per file (path, size, mtime) under
$GRAFT_GGUF_CACHE, else ~/.cache/graft/gguf.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path

from graft.errors import GraftConfigError

GGUF_WEIGHTS = "model.gguf"  # the link to the file, in the LLM dir
DIR_FORMAT = 3  # what a dir holds changed (MoE configs, end tokens, names): older dirs are not reused
# {"source", "architecture", "types": {HF weight name: GGUF type}, "tensors": {HF weight name:
# its GGUF tensors}}: the names, transformers' map, kept so an engine start need not rebuild it
GGUF_INFO = "gguf.json"


def is_gguf_file(path: str | os.PathLike) -> bool:
    p = Path(path).expanduser()
    return p.suffix.lower() == ".gguf" and p.is_file()


def gguf_weights(model_dir: str | os.PathLike) -> Path | None:
    """The GGUF file an LLM dir's weights are in (a dir `gguf_llm_dir` made), else None."""
    p = Path(model_dir) / GGUF_WEIGHTS
    if not p.is_symlink() and not p.is_file() or any(Path(model_dir).glob("*.safetensors")):
        return None
    if not p.is_file():
        raise GraftConfigError(f"{model_dir}: its {GGUF_WEIGHTS} links to {os.readlink(p)}, which "
                               "is gone; give the GGUF file itself (graft serve FILE.gguf)")
    return p


def from_pretrained_kwargs(model_dir: str | os.PathLike) -> dict:
    """What transformers' from_pretrained(model_dir, ...) needs to read a GGUF-backed dir: the
    file, and the dir's config (transformers' own reading of the file, with what it misses
    filled in: a Qwen3-MoE's expert width)."""
    if gguf_weights(model_dir) is None:
        return {}
    from transformers import AutoConfig

    return {"gguf_file": GGUF_WEIGHTS, "config": AutoConfig.from_pretrained(model_dir)}


@contextlib.contextmanager
def quiet_gguf_bar():
    """transformers' per-tensor GGUF bar obeys only tqdm's own switch: off here whenever
    transformers' bars are (graft's commands turn those off unless --verbose)."""
    import functools
    from unittest import mock

    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils.logging import is_progress_bar_enabled

    quiet = functools.partial(reader.tqdm, disable=not is_progress_bar_enabled())
    with mock.patch.object(reader, "tqdm", quiet):
        yield


def gguf_types(model_dir: str | os.PathLike) -> dict[str, str]:
    """{HF weight name: GGUF type name} of a GGUF-backed LLM dir ({} for any other dir)."""
    return _info(model_dir).get("types", {})


def gguf_tensor_names(model_dir: str | os.PathLike) -> dict[str, list[str]]:
    """{HF weight name: the GGUF tensors it is read from} of a GGUF-backed LLM dir ({} for
    any other dir)."""
    return _info(model_dir).get("tensors", {})


def _info(model_dir) -> dict:
    info = Path(model_dir) / GGUF_INFO
    if gguf_weights(model_dir) is None or not info.is_file():
        return {}
    return json.loads(info.read_text(encoding="utf-8"))


def cache_root() -> Path:
    env = os.environ.get("GRAFT_GGUF_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "graft" / "gguf"


def model_path(path: str | os.PathLike) -> Path:
    """`path` itself, or for a .gguf file its LLM dir (made on first use): what a command's
    MODEL/PATH argument means."""
    return gguf_llm_dir(path) if is_gguf_file(path) else Path(path)


def gguf_llm_dir(path: str | os.PathLike, log=None) -> Path:
    """The LLM dir of GGUF file `path`, made when missing (a second call returns it)."""
    from graft.io import atomic_write_dir

    src = Path(path).expanduser().resolve()
    if not src.is_file():
        raise GraftConfigError(f"{path}: no such GGUF file")
    st = src.stat()
    key = hashlib.sha256(f"{src}:{st.st_size}:{st.st_mtime_ns}:{DIR_FORMAT}".encode()).hexdigest()[:16]
    out = cache_root() / f"{src.stem}-{key}"
    if (out / GGUF_INFO).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".lock", "w") as lock:  # workers of one fleet start together
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / GGUF_INFO).is_file():
            (log or (lambda _msg: None))(f"reading {src.name}'s config and tokenizer into {out}")
            atomic_write_dir(out, lambda tmp: _write_dir(src, tmp))
    return out


FAMILIES = ("llama", "qwen2", "qwen3", "qwen3moe")  # the GGUF architectures graft reads


def _write_dir(src: Path, out: Path) -> None:
    import struct

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from graft.gguf_file import GGUFFile

    def cannot(err) -> GraftConfigError:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return GraftConfigError(f"{src}: graft cannot read this GGUF ({first}); graft serves GGUF "
                                "files of the Llama, Qwen2, Qwen3 and Qwen3-MoE families")

    try:
        file = GGUFFile(src)
    except (ValueError, KeyError, OSError, struct.error) as err:
        raise cannot(err) from None
    if file.architecture not in FAMILIES:  # before transformers spends seconds on the rest
        raise cannot(f"its architecture is {file.architecture!r}")
    parts = int(file.metadata.get("split.count", 1))
    if parts > 1:  # llama.cpp's gguf-split: the other parts hold the rest of the tensors
        raise cannot(f"it is part {int(file.metadata.get('split.no', 0)) + 1} of {parts} of a split "
                     "GGUF; join the parts into one file with llama.cpp's "
                     "`llama-gguf-split --merge FIRST-PART OUT.gguf`")
    try:
        with _metadata_parsed_once():
            config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
            tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        # transformers reads no expert width from a Qwen3-MoE GGUF (it keeps the class default)
        width = file.metadata.get(f"{file.architecture}.expert_feed_forward_length")
        if width is not None and hasattr(config, "moe_intermediate_size"):
            config.moe_intermediate_size = int(width)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        types, tensors = _weight_types(file, model)
    except (ValueError, KeyError, NotImplementedError, OSError) as err:
        raise cannot(err) from None
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    generation.eos_token_id = _end_ids(file, generation.eos_token_id)
    generation.save_pretrained(out)
    (out / GGUF_WEIGHTS).symlink_to(src)
    info = {"source": str(src), "architecture": config.model_type, "types": types, "tensors": tensors}
    (out / GGUF_INFO).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _end_ids(file, eos) -> int | list[int] | None:
    """The ids a generation ends at: the config's eos and, as llama.cpp does (its end-of-
    generation set), the file's end-of-turn and end-of-message tokens (a Llama-3 file whose eos
    is <|end_of_text|> ends its turns with <|eot_id|>)."""
    ends = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    for key in ("eos", "eot", "eom"):
        found = file.metadata.get(f"tokenizer.ggml.{key}_token_id")
        if found is not None and int(found) not in ends:
            ends.append(int(found))
    return None if not ends else ends[0] if len(ends) == 1 else ends


@contextlib.contextmanager
def _metadata_parsed_once():
    """transformers' config and tokenizer readers each parse the whole file's metadata (gguf-py's
    reader, the vocabulary included: ~3 s for SmolLM2's 49k tokens); the second gets a copy
    of the first's result."""
    import copy
    from unittest import mock

    from transformers import modeling_gguf_pytorch_utils as reader

    parse, seen = reader.load_gguf_checkpoint, {}

    def once(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return parse(path, return_tensors, **kwargs)
        if str(path) not in seen:
            seen[str(path)] = parse(path)
        return copy.deepcopy(seen[str(path)])

    with mock.patch.object(reader, "load_gguf_checkpoint", once):
        yield


def _weight_types(file, model) -> tuple[dict[str, str], dict[str, list[str]]]:
    """({HF weight name: GGUF type}, {HF weight name: its GGUF tensors}) through transformers'
    own GGUF -> HF name map; a weight made of several GGUF tensors (a MoE layer's gate and up
    experts) has their types joined by "+"."""
    from graft.gguf_file import hf_names

    tensors: dict[str, list[str]] = {}
    for name, hf in hf_names(file, model)[0].items():
        tensors.setdefault(hf, []).append(name)
    return {hf: "+".join(file.tensors[n][0] for n in names) for hf, names in tensors.items()}, tensors
