"""`--device` on every command that takes it: a name torch does not know, or a GPU this
machine does not have, is one argparse line naming the flag, not a traceback at load time."""

import pytest

from tests.graft.cli_asserts import fails

COMMANDS = [["serve", "runs/x"], ["chat", "runs/x", "hi"], ["eval", "--model", "runs/x"],
            ["quantize", "runs/x"], ["bench", "engine"], ["bench", "grafts"]]


def _missing_gpu() -> str:
    import torch

    return f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_bad_device_is_one_line(command, capsys):
    fails(capsys, [*command, "--device", "bogus"], "--device", "'bogus' is not a device")
    fails(capsys, [*command, "--device", _missing_gpu()], "--device", "no such GPU")


def test_serve_yaml_device_is_checked(tmp_path, capsys):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("path: runs/x\ndevice: gpu0\n")
    fails(capsys, ["serve", "--config", str(cfg)], "device", "'gpu0' is not a device")


def test_good_devices_pass():
    from graft.cli_types import torch_device

    assert torch_device("cpu") == "cpu"
    assert torch_device("CPU") == "cpu"
