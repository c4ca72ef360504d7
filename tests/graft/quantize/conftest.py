"""A tiny LLM with one planted harmless group, and a tiny text task whose answers depend on
the weights (reference: the fp32 model's own greedy answers, metric: identical)."""

import json

import pytest
import torch

PROMPTS = ["What is shown in the image?", "Which digit is shown?", "Describe the picture.",
           "Hello! How can I help you today?", "red green blue yellow", "The quick brown fox",
           "There are three blue squares", "zero one two three four", "left right top bottom",
           "Please describe the scene.", "circle square triangle star", "0 1 2 3 4 5 6 7"]


def plant_int4_exact(weight: torch.Tensor, seed: int) -> torch.Tensor:
    """Values on the int4-g32 grid (q - 8) / 32 with q = 0 and q = 15 in every group: int4
    quantization returns them exactly (and bf16 holds them), int8 does not."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, weight.shape, generator=gen)
    q[:, 0::32], q[:, 1::32] = 0, 15
    return (q.float() - 8) / 32


@pytest.fixture(scope="session")
def planted_llm(tmp_path_factory):
    """Tiny llama whose layer-1 MLP is exact in int4: quantizing it there changes nothing."""
    from transformers import AutoModelForCausalLM

    from tests.tiny_llm import build_llm

    out = build_llm(tmp_path_factory.mktemp("planted_llm"), "llama", seed=3)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    mlp = model.model.layers[1].mlp
    with torch.no_grad():
        for i, proj in enumerate((mlp.gate_proj, mlp.up_proj, mlp.down_proj)):
            proj.weight.copy_(plant_int4_exact(proj.weight, i))
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def text_task(tmp_path_factory):
    """(task YAML path, calibration text file)."""
    root = tmp_path_factory.mktemp("quant_task")
    (root / "eval").mkdir()
    rows = [{"id": f"p{i}", "question": p} for i, p in enumerate(PROMPTS)]
    (root / "eval" / "text.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = root / "tiny_text.yaml"
    task.write_text("name: tiny_text\ndata: eval/text.jsonl\ndata_root: .\nprompt: \"{question}\"\n"
                    "reference: base_llm\ngeneration: {max_new_tokens: 8, temperature: 0.0}\n"
                    "metrics: [identical]\n")
    calib = root / "calib.txt"
    calib.write_text("\n\n".join(PROMPTS))
    return task, calib


@pytest.fixture(scope="session")
def planted_run(tmp_path_factory, planted_llm, tiny_encoder_config):
    """(run dir over the planted LLM with LLaVA training data, image task YAML)."""
    from graft.spec import GraftSpec
    from tests.conftest import _write_run
    from tests.graft.conftest import make_dataset

    root = tmp_path_factory.mktemp("quant_run")
    train = make_dataset(root / "data", n=12)
    run = _write_run(root, "run", tiny_encoder_config("siglip"), planted_llm, 0, record_sha=False)
    spec = GraftSpec.load(run / "graft.yaml", [f"data.train={train}", f"data.image_root={train.parent}"])
    spec.save(run / "graft.yaml")
    rows = json.loads(train.read_text())
    (root / "data" / "eval").mkdir()
    (root / "data" / "eval" / "colors.jsonl").write_text("".join(
        json.dumps({"id": r["id"], "image": r["image"], "question": "What color?",
                    "answer": r["conversations"][1]["value"]}) + "\n" for r in rows))
    task = root / "data" / "tiny_colors.yaml"
    task.write_text("name: tiny_colors\ndata: eval/colors.jsonl\ndata_root: .\n"
                    "prompt: \"{question}\"\ngeneration: {max_new_tokens: 4, temperature: 0.0}\n"
                    "metrics: [exact_match]\n")
    return run, task
