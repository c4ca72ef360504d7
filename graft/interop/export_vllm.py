"""Export a run dir as a directory `vllm serve` loads with graft's vLLM plugin.

Layout of OUT (every graft kind: any encoder, any projector):
- config.json: the LLM's own config (so vLLM builds its own Llama/Qwen2/Qwen3/GLM4 ...), with
  architectures = GraftForConditionalGeneration and a `graft` block (the LLM's architectures,
  the `<image>` token id, the encoder's token grid, widths) the plugin reads;
- the LLM's weight files, hard-linked where the filesystem allows (else copied; the run's
  files are never written), or one merged model.safetensors for a LoRA run;
- tokenizer files with `<image>` as one added special token (vLLM's prompt updates match token
  ids, not text) and the LLM's chat template behind graft's content-parts step;
- graft/: a run dir (graft.yaml with relative paths, adapter files) plus the encoder's files.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from graft.errors import GraftConfigError
from graft.interop.export_llava import IMAGE_TOKEN, multimodal_chat_template
from graft.run_dir import SPEC_FILE
from graft.serving.vllm_plugin import ARCHITECTURE  # no vllm import: graft's venv has none

MARKER = "graft_export.json"
_WEIGHT_GLOBS = ("*.safetensors", "*.safetensors.index.json")
# sizes the export checks the weight-free count against the real encoder + projector with
_CHECK_SIZES = ((37, 23), (23, 37), (64, 64), (640, 480), (1024, 1024))


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)


def _llm_weight_files(llm_path: Path) -> list[Path]:
    files = sorted({p for g in _WEIGHT_GLOBS for p in llm_path.glob(g)})
    if not any(p.suffix == ".safetensors" for p in files):
        raise GraftConfigError(f"llm.path {llm_path}: no *.safetensors weights; vLLM exports "
                               "take safetensors (save the LLM with save_pretrained)")
    return files


def _encoder_files(path: str | None) -> list[tuple[Path, str]]:
    """(source, path inside graft/encoder) for every file the encoder is built from."""
    if not path:
        return []  # random-init timm encoder: nothing on disk, the seed rebuilds it
    src = Path(path)
    if src.is_file():
        return [(src, src.name)]
    return [(p, str(p.relative_to(src))) for p in sorted(src.rglob("*")) if p.is_file()]


def _tokenizer(llm_path: Path):
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(llm_path))
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        # not normalized, no stripping: text around it tokenizes as graft's pieces do
        tokenizer.add_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False,
                                         lstrip=False, rstrip=False)], special_tokens=True)
    tokenizer.chat_template = multimodal_chat_template(tokenizer.chat_template)
    return tokenizer, tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)


def _largest_image(counter) -> list[int]:
    """A size with the most image tokens (vLLM profiles memory with it)."""
    sizes = [(s, s) for s in (224, 448, 896, 1792)]
    return list(max(sizes, key=lambda wh: counter(*wh)))


def export_vllm(run_dir: str | Path, out: str | Path) -> dict:
    from safetensors.torch import save_file

    from graft.image_path import ImagePath
    from graft.interop.export_llava import _llm_tensors
    from graft.interop.extract import check_output_dir, write_dir_atomically
    from graft.io import atomic_write_json, atomic_write_text
    from graft.run_dir import RunDir
    from graft.serving.vllm_plugin.geometry import (CONFIG_KEY, GRAFT_SUBDIR, ImageTokenCounter,
                                                    encoder_geometry, load_export_spec)
    from graft.spec import GraftSpec

    import yaml

    run, out = RunDir.open(run_dir), Path(out)
    check_output_dir(out, MARKER)  # before minutes of loading
    spec = run.load_spec()
    llm_path = Path(GraftSpec.expand(spec.llm.path))
    config = json.loads((llm_path / "config.json").read_text())
    text_archs = config.get("architectures") or []
    if not text_archs or text_archs == [ARCHITECTURE]:
        raise GraftConfigError(f"llm.path {llm_path}: config.json names no causal-LM "
                               "architecture (e.g. LlamaForCausalLM); vLLM needs it to build the LLM")
    weight_files = _llm_weight_files(llm_path)
    image_path = ImagePath.from_spec(spec, int(config["hidden_size"]), run.path)
    tokenizer, image_id = _tokenizer(llm_path)
    lora = run.lora_dir if run.has_lora else None

    encoder = dict(spec.encoder)
    enc_files = _encoder_files(GraftSpec.expand(encoder.get("path")))
    if encoder.get("path"):
        src = Path(GraftSpec.expand(encoder["path"]))
        encoder["path"] = "encoder/" + src.name if src.is_file() else "encoder"
    # the LLM is the export itself (graft/..); a merged LoRA changes its weights' digest
    llm = {"path": "..", "dtype": spec.llm.dtype}
    if lora is None and spec.llm.sha256:
        llm["sha256"] = spec.llm.sha256
    graft_yaml = {"encoder": encoder, "adapter": dict(spec.adapter), "llm": llm}

    meta = {"text_architectures": text_archs, "image_token": IMAGE_TOKEN,
            "image_token_id": image_id, **encoder_geometry(image_path),
            "encoder_kind": encoder.get("kind"), "adapter_kind": image_path.projector.config.kind}
    config.update(architectures=[ARCHITECTURE], dtype=spec.llm.dtype)
    config.pop("torch_dtype", None)  # transformers 5 reads `dtype`; one spelling only
    summary = {"format": "vllm", "run_dir": str(run.path), "out": str(out),
               "text_architectures": text_archs, "image_token_id": image_id,
               "lora_merged": lora is not None, "dtype": spec.llm.dtype}

    def write(tmp: Path) -> None:
        if lora is None:
            for f in weight_files:
                _link_or_copy(f, tmp / f.name)
        else:  # one merged checkpoint, in the dtype graft ran the LLM in
            from graft.model import DTYPES

            state = _llm_tensors(llm_path, lora)
            save_file({k: v.to(DTYPES[spec.llm.dtype]).contiguous() for k, v in state.items()},
                      str(tmp / "model.safetensors"), metadata={"format": "pt"})
        if (llm_path / "generation_config.json").is_file():
            _link_or_copy(llm_path / "generation_config.json", tmp / "generation_config.json")
        tokenizer.save_pretrained(str(tmp))
        sub = tmp / GRAFT_SUBDIR
        for src, rel in enc_files:
            _link_or_copy(src, sub / "encoder" / rel)
        for f in (run.adapter_weights, run.adapter_config):
            _link_or_copy(f, sub / f.name)
        atomic_write_text(sub / SPEC_FILE, yaml.safe_dump(graft_yaml, sort_keys=False))
        counter = ImageTokenCounter(meta, load_export_spec(tmp))
        for w, h in _CHECK_SIZES:  # the front-end's weight-free count must be graft's
            want, got = image_path.image_token_count(w, h), counter(w, h)
            if want != got:
                raise GraftConfigError(f"a {w}x{h} image: the encoder + projector give {want} "
                                       f"tokens but the export's weight-free count gives {got}")
        meta["largest_image"] = _largest_image(counter)
        atomic_write_json(tmp / "config.json", {**config, CONFIG_KEY: meta})
        atomic_write_json(tmp / MARKER, summary)

    write_dir_atomically(out, write, MARKER)
    return summary
