"""Export a run dir as an HF `LlavaForConditionalGeneration` checkpoint plus its processor.

Exports when the encoder is `clip`/`siglip` at its native image size, the adapter is
`linear` or `mlp` (depth 2, no pre-norm, inner width = LLM width) and the LLM is a causal LM
stored as `model.*` + `lm_head` (llama, qwen2, qwen3, glm4, ...). Why others do not:
Llava's vision tower is a fixed-resolution HF tower read at one hidden-state index (timm and
MoonViT are not; MoonViT also changes token counts per image), and its projector is exactly
Linear -> activation -> Linear per token (no pre-norm, no token merging or resampling).
Weights are copied tensor by tensor; the LLM is never instantiated unless a LoRA must be merged.
The processor's chat template is the LLM's, behind a step that turns {"type": "image"} /
{"type": "text"} content parts into the `<image>`-marker text graft itself builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from graft.errors import GraftConfigError

IMAGE_TOKEN = "<image>"
TOWER_MODEL_TYPES = {"clip": ("clip", "clip_vision_model"),
                     "siglip": ("siglip", "siglip_vision_model")}


def export_problems(encoder: dict, adapter_cfg: dict, d_model: int) -> list[str]:
    """Every reason this encoder/adapter pair cannot become a Llava checkpoint (empty: it can)."""
    problems = []
    kind = encoder.get("kind")
    if kind not in TOWER_MODEL_TYPES:
        problems.append(f"encoder.kind={kind!r}: Llava's vision tower is an HF CLIP/SigLIP "
                        "tower (timm and MoonViT towers have no Llava equivalent)")
    if encoder.get("image_size") is not None:
        problems.append("encoder.image_size is set: Llava runs the tower at its native size only")
    akind = adapter_cfg.get("kind")
    if akind not in ("linear", "mlp"):
        problems.append(f"adapter.kind={akind!r}: Llava's projector is per-token "
                        "Linear-GELU-Linear; it cannot merge or resample tokens")
    if akind == "mlp" and adapter_cfg.get("depth", 2) != 2:
        problems.append(f"adapter.depth={adapter_cfg.get('depth')}: Llava's projector has exactly 2 Linears")
    if akind == "mlp" and adapter_cfg.get("hidden_size") not in (None, d_model):
        problems.append(f"adapter.hidden_size={adapter_cfg.get('hidden_size')}: Llava's inner "
                        f"width is the LLM width {d_model}")
    if adapter_cfg.get("layer_norm"):
        problems.append("adapter.layer_norm is on: Llava's projector has no pre-norm")
    return problems


def _tower(encoder: dict):
    """(vision config dict, state dict) of the HF CLIP/SigLIP tower, as Llava's AutoModel names it."""
    from transformers import AutoModel, CLIPVisionModel, SiglipVisionModel

    root = Path(encoder["path"])
    config = json.loads((root / "config.json").read_text())
    model_types = TOWER_MODEL_TYPES[encoder["kind"]]
    if config.get("model_type") not in model_types:
        raise GraftConfigError(f"encoder.path {root}: model_type {config.get('model_type')!r}, "
                               f"expected {' or '.join(model_types)}")
    # Loading through transformers reads vision-only and dual-encoder dirs alike.
    cls = CLIPVisionModel if encoder["kind"] == "clip" else SiglipVisionModel
    tower = cls.from_pretrained(str(root))
    vision = tower.config.to_dict()
    # Llava builds its tower with AutoModel.from_config: use that class's names.
    with torch.device("meta"):
        names = set(AutoModel.from_config(tower.config).state_dict())
    state = tower.state_dict()
    if set(state) != names:
        raise GraftConfigError(f"encoder.path {root}: tower tensors do not match Llava's "
                               f"{sorted(names ^ set(state))[:4]}")
    return vision, state


def _llm_tensors(llm_path: Path, lora_dir: Path | None) -> dict:
    """The causal LM's tensors; with a LoRA dir, the LoRA is merged into them first. A GGUF
    LLM (graft.gguf_llm) is written dequantized, as transformers reads it."""
    from graft.gguf_llm import from_pretrained_kwargs, quiet_gguf_bar

    gguf = from_pretrained_kwargs(llm_path)
    if lora_dir is not None or gguf:
        from transformers import AutoModelForCausalLM

        with quiet_gguf_bar():
            merged = AutoModelForCausalLM.from_pretrained(str(llm_path), **gguf)
        if lora_dir is not None:
            from peft import PeftModel

            merged = PeftModel.from_pretrained(merged, str(lora_dir)).merge_and_unload()
        state = dict(merged.state_dict())
        if merged.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        return state
    from graft.encoders.moonvit_weights import CheckpointReader

    reader = CheckpointReader(llm_path)
    return {k: reader.get(k) for k in reader.keys()}


# Put in front of the LLM's own template: messages whose content is a list of parts become
# the text graft builds for them (serving/http/openai/openai_chat.py to_chat_messages): parts joined
# with "\n", each image part an <image> marker, so the template below only sees strings.
_PARTS_TO_TEXT = """{%- set graft = namespace(messages=[]) -%}
{%- for message in messages -%}
{%- if message['content'] is string -%}
{%- set graft.messages = graft.messages + [message] -%}
{%- elif message['content'] is none -%}
{%- set graft.messages = graft.messages + [dict(message, content='')] -%}
{%- else -%}
{%- set parts = namespace(text=[]) -%}
{%- for part in message['content'] -%}
{%- if part is string -%}{%- set parts.text = parts.text + [part] -%}
{%- elif part['type'] == 'text' -%}{%- set parts.text = parts.text + [part['text']] -%}
{%- elif part['type'] in ('image', 'image_url') -%}{%- set parts.text = parts.text + ['<image>'] -%}
{%- else -%}{{ raise_exception('content part type ' ~ part['type'] ~ ' is not supported: use text or image parts') }}
{%- endif -%}
{%- endfor -%}
{%- set graft.messages = graft.messages + [dict(message, content=parts.text | join('\n'))] -%}
{%- endif -%}
{%- endfor -%}
{%- set messages = graft.messages -%}
"""


def multimodal_chat_template(text_template: str | None) -> str | None:
    """The LLM's chat template, taking {"type": "image"} / {"type": "text"} content parts too."""
    return None if text_template is None else _PARTS_TO_TEXT + text_template


def _grow_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    # The image token's row is never read as input (Llava overwrites it with image features);
    # zeros give it a constant 0 logit, and generation_config suppresses it.
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if rows > t.shape[0] else t


def export_llava(run_dir: str | Path, out: str | Path) -> dict:
    from safetensors.torch import save_file
    from transformers import (AutoConfig, AutoImageProcessor, AutoTokenizer, GenerationConfig,
                              LlavaConfig, LlavaProcessor)

    from graft.adapters import load_adapter
    from graft.interop.extract import check_output_dir, write_dir_atomically
    from graft.io import atomic_write_json
    from graft.run_dir import RunDir
    from graft.spec import GraftSpec

    run, out = RunDir.open(run_dir), Path(out)
    check_output_dir(out, "graft_export.json")  # before minutes of loading
    run_dir, spec = run.path, run.load_spec()
    llm_path = Path(GraftSpec.expand(spec.llm.path))
    text = AutoConfig.from_pretrained(str(llm_path))
    adapter = load_adapter(run_dir)
    encoder = {**spec.encoder, "path": GraftSpec.expand(spec.encoder.get("path"))}
    problems = export_problems(encoder, adapter.config.to_dict(), text.hidden_size)
    if problems:
        raise GraftConfigError("cannot export to hf-llava: " + "; ".join(problems))

    vision, tower = _tower(encoder)
    lora = run.lora_dir if run.has_lora else None
    llm = _llm_tensors(llm_path, lora)
    if "model.embed_tokens.weight" not in llm:
        raise GraftConfigError(f"llm.path {llm_path}: no model.embed_tokens.weight; Llava wraps "
                               "causal LMs stored as model.* + lm_head (llama, qwen2, qwen3, glm4)")
    tokenizer = AutoTokenizer.from_pretrained(str(llm_path))
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    rows = max(image_id + 1, llm["model.embed_tokens.weight"].shape[0])

    state = {f"model.vision_tower.{k}": v for k, v in tower.items()}
    for key, value in llm.items():
        if key == "lm_head.weight":
            state[key] = _grow_rows(value, rows)
        elif key.startswith("model."):
            grown = _grow_rows(value, rows) if key == "model.embed_tokens.weight" else value
            state["model.language_model." + key[len("model."):]] = grown
        else:
            raise GraftConfigError(f"llm.path {llm_path}: tensor {key!r} is neither model.* nor "
                                   "lm_head; this LLM layout has no Llava equivalent")
    linears = adapter.mlp.linears
    state["model.multi_modal_projector.linear_1.weight"] = linears[0].weight.detach()
    state["model.multi_modal_projector.linear_1.bias"] = linears[0].bias.detach()
    if len(linears) == 2:
        act = "gelu"
        state["model.multi_modal_projector.linear_2.weight"] = linears[1].weight.detach()
        state["model.multi_modal_projector.linear_2.bias"] = linears[1].bias.detach()
    else:  # linear adapter: identity activation and an identity second Linear, exactly
        act = "linear"
        d = adapter.d_model
        state["model.multi_modal_projector.linear_2.weight"] = torch.eye(d)
        state["model.multi_modal_projector.linear_2.bias"] = torch.zeros(d)

    text_dict = text.to_dict()
    text_dict["vocab_size"] = rows
    drop_cls = encoder["kind"] == "clip" and encoder.get("drop_prefix", True)
    feature_layer = encoder.get("feature_layer", -2)
    config = LlavaConfig(
        vision_config=vision, text_config=text_dict, image_token_id=image_id,
        projector_hidden_act=act, vision_feature_layer=feature_layer,
        vision_feature_select_strategy="default" if drop_cls else "full",
        multimodal_projector_bias=True,
        tie_word_embeddings=bool(text.tie_word_embeddings))
    config.architectures = ["LlavaForConditionalGeneration"]
    config.dtype = spec.llm.dtype  # the dtype graft ran the LLM in
    if text.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}.get(spec.llm.dtype, torch.float32)

    if (llm_path / "generation_config.json").is_file():
        generation = GenerationConfig.from_pretrained(str(llm_path))
    else:
        generation = GenerationConfig.from_model_config(text)
    generation.suppress_tokens = [image_id]
    processor = LlavaProcessor(
        image_processor=AutoImageProcessor.from_pretrained(encoder["path"]), tokenizer=tokenizer,
        patch_size=vision["patch_size"],
        vision_feature_select_strategy=config.vision_feature_select_strategy,
        num_additional_image_tokens=1 if encoder["kind"] == "clip" else 0,
        chat_template=multimodal_chat_template(tokenizer.chat_template), image_token=IMAGE_TOKEN)

    summary = {"format": "hf-llava", "run_dir": str(run_dir), "out": str(out),
               "image_token_id": image_id, "vocab_size": rows, "projector_act": act,
               "vision_feature_layer": feature_layer, "lora_merged": lora is not None,
               "select_strategy": config.vision_feature_select_strategy}

    def write(tmp: Path) -> None:
        save_file({k: v.to(dtype).contiguous() for k, v in state.items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(str(tmp))
        generation.save_pretrained(str(tmp))
        processor.save_pretrained(str(tmp))
        atomic_write_json(tmp / "graft_export.json", summary)

    write_dir_atomically(out, write, "graft_export.json")
    return summary
