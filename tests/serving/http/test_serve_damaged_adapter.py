"""`graft serve` on a run dir whose adapter.safetensors is damaged (truncated, empty, random
bytes) or holds NaN: one line naming the file, no traceback, nothing served."""

import pytest

from tests.graft.cli_asserts import fails
from tests.serving.http.conftest import _free_port


@pytest.mark.parametrize("damage", ["truncated", "empty", "random", "nan"])
def test_a_damaged_adapter_is_one_line(tiny_run_dir, tmp_path, capsys, damage):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir, run)
    weights = run / "adapter.safetensors"
    if damage == "nan":
        state = {k: torch.full_like(v, float("nan")) for k, v in load_file(str(weights)).items()}
        save_file(state, str(weights))
        needle = "not finite"
    else:
        data = weights.read_bytes()
        weights.write_bytes({"truncated": data[:len(data) // 2], "empty": b"",
                             "random": bytes(range(256)) * 64}[damage])
        needle = "not a readable safetensors file"
    err = fails(capsys, ["serve", str(run), "--port", str(_free_port()), "--max-model-len", "64",
                         "--num-kv-blocks", "8"], "adapter.safetensors", needle)
    assert len(err.strip().splitlines()) == 1, err
