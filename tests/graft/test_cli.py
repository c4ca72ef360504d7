"""The CLI end to end: train from a YAML file, inspect, chat; errors without tracebacks."""

import json

import yaml
from PIL import Image

from graft.cli import main


def test_train_inspect_chat(make_spec, tmp_path, capsys):
    spec = make_spec(max_steps=2, gradient_checkpointing=True)
    cfg = tmp_path / "graft.yaml"
    cfg.write_text(yaml.safe_dump(spec.to_dict()))
    out_dir = tmp_path / "cli-run"
    assert main(["train", str(cfg), "--set", f"output_dir={out_dir}", "--set", "train.max_steps=1"]) == 0
    assert (out_dir / "adapter.safetensors").is_file()

    capsys.readouterr()
    assert main(["inspect", str(out_dir), "--json", "--image-size", "32x32"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["projector"]["trainable"] == info["projector"]["params"] > 0
    assert info["llm"]["trainable"] == 0 and info["encoder"]["trainable"] == 0
    assert info["image_tokens"]["32x32"]["llm"] == 16

    img = tmp_path / "q.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(img)
    assert main(["chat", str(out_dir), "--image", str(img), "What color?", "--max-new-tokens", "3"]) == 0
    hf_answer = capsys.readouterr().out.strip()
    assert hf_answer != ""
    # --quantization answers on the engine (the tiny tokenizer's bytes need not be whole
    # characters, which the engine's detokenizer holds back, so only the exit is checked)
    chat = ["chat", str(out_dir), "--image", str(img), "What color?", "--max-new-tokens", "3"]
    for scheme in ("fp32", "int4"):
        assert main(chat + ["--quantization", scheme]) == 0
    capsys.readouterr()
    assert main(chat + ["--quantization", "int3"]) == 2
    assert "quantization='int3' is neither a scheme" in capsys.readouterr().err


def test_cli_errors_are_messages(tmp_path, capsys):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["nonsense"]) == 2
    assert main(["--help"]) == 0
    assert "train" in capsys.readouterr().out
