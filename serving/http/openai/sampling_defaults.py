"""The model's own sampling defaults, as vLLM's `--generation-config auto` (its default)
applies them: what a request leaves unset takes the temperature, top_p, top_k, min_p,
penalties and max_new_tokens its generation_config.json sets apart from HF's defaults, and
OpenAI's defaults only where it sets none. `vllm` keeps OpenAI's defaults; a folder reads its
generation_config.json instead of the model's."""

from __future__ import annotations

from pathlib import Path

from graft.errors import GraftConfigError

# vLLM's list (ModelConfig.get_diff_sampling_param); max_new_tokens is max_tokens
FIELDS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "temperature", "top_k",
          "top_p", "min_p", "max_new_tokens")


def model_sampling_defaults(source: str, model_dir: str | Path | None = None) -> dict:
    """{request field: default} from `source` ("auto": model_dir's generation_config.json,
    "vllm": none, else a folder holding one)."""
    from transformers import GenerationConfig

    if source == "vllm":
        return {}
    folder = Path(model_dir) if source == "auto" else Path(source).expanduser()
    if not (folder / "generation_config.json").is_file():
        if source == "auto":
            return {}
        raise GraftConfigError(f"--generation-config {source}: no generation_config.json there; "
                               "give its folder, or auto (the model's) or vllm (none)")
    try:
        config = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except (OSError, ValueError) as err:
        raise GraftConfigError(f"--generation-config: {folder / 'generation_config.json'} cannot "
                               f"be read ({' '.join(str(err).split())})") from None
    found = {k: config[k] for k in FIELDS if config.get(k) is not None}
    if "max_new_tokens" in found:
        found["max_tokens"] = found.pop("max_new_tokens")
    return found
