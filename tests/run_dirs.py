"""Graft run dirs written by hand, as `graft train` leaves them (for export tests)."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml


def write_run_dir(out: Path, llm_dir: Path, encoder: dict, adapter: dict, lora: bool = False,
                  seed: int = 0) -> Path:
    """What `graft train` leaves behind: graft.yaml + adapter.safetensors/adapter.json."""
    from graft.adapters import AdapterConfig, build_adapter, save_adapter
    from graft.encoders import EncoderConfig, build_encoder
    from graft.io import weights_sha256
    from transformers import AutoConfig

    out.mkdir(parents=True, exist_ok=True)
    enc = build_encoder(EncoderConfig.from_dict(dict(encoder)))
    d_model = AutoConfig.from_pretrained(str(llm_dir)).hidden_size
    proj = build_adapter(AdapterConfig.from_dict(dict(adapter)), enc.hidden_size, d_model)
    with torch.no_grad():  # trained-looking weights: large enough to move the logits
        for p in proj.parameters():
            p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(seed + p.numel()))
    save_adapter(proj, out)
    spec = {"encoder": dict(encoder), "adapter": dict(adapter),
            "llm": {"path": str(llm_dir), "sha256": weights_sha256(llm_dir)}}
    (out / "graft.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    if lora:
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        llm = AutoModelForCausalLM.from_pretrained(str(llm_dir))
        peft = get_peft_model(llm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # LoRA B starts at zero; make the merge change something
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.2)
        peft.save_pretrained(str(out / "lora"))
    return out
