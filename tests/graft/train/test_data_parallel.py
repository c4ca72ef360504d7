"""Two real CPU processes (gloo, `accelerate launch`) train like one process on the global batch."""

from types import SimpleNamespace

import pytest
import torch

from graft.errors import GraftConfigError
from graft.train.distributed import check_launch
from graft.train.loop import train
from tests.graft.train.launch import launch_train, metric_rows as _rows, uneven_dataset as _uneven_dataset


@pytest.mark.slow
def test_two_processes_equal_one_on_uneven_answers(make_spec, tmp_path):
    from safetensors.torch import load_file

    data = _uneven_dataset(tmp_path / "data")

    def spec(batch_size, out):
        s = make_spec(batch_size=batch_size, max_steps=4, lr=1e-2, max_grad_norm=1.0)
        s.data.train, s.data.image_root, s.output_dir = str(data), str(data.parent), str(tmp_path / out)
        return s

    one = train(spec(8, "one"))
    two = spec(4, "two")
    two.save(tmp_path / "two.yaml")
    proc = launch_train(tmp_path / "two.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world size 2" in proc.stderr

    a, b = _rows(one), _rows(tmp_path / "two")
    assert [r["step"] for r in b] == [1, 2, 3, 4]  # one writer, two epochs of a full and a 1-sample batch
    assert [r["loss"] for r in b] == pytest.approx([r["loss"] for r in a], rel=1e-5)
    assert [r["grad_norm"] for r in b] == pytest.approx([r["grad_norm"] for r in a], rel=1e-4)
    wa, wb = load_file(str(one / "adapter.safetensors")), load_file(str(tmp_path / "two" / "adapter.safetensors"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5


def _accel(n):
    return SimpleNamespace(num_processes=n, process_index=0, distributed_type="MULTI_CPU" if n > 1 else "NO")


def test_launches_that_would_not_be_data_parallel_are_refused():
    # --multi_gpu on a CPU box without ACCELERATE_USE_CPU: two lone processes, one run dir
    with pytest.raises(GraftConfigError, match="WORLD_SIZE=2 processes were launched but each runs alone"):
        check_launch(_accel(1), {"WORLD_SIZE": "2", "MASTER_PORT": "29500"})
    # --cpu --num_processes 2: accelerate's simple launcher starts a single process
    with pytest.raises(GraftConfigError, match="asked for several processes but started one"):
        check_launch(_accel(1), {"MASTER_PORT": "29500", "ACCELERATE_USE_CPU": "True"})
    check_launch(_accel(2), {"WORLD_SIZE": "2", "MASTER_PORT": "29500", "ACCELERATE_USE_CPU": "true"})
    check_launch(_accel(1), {})


def test_one_process_loss_is_untouched():
    from graft.train.distributed import global_token_loss

    loss = torch.tensor(1.2345678, requires_grad=True)
    out, value = global_token_loss(loss, torch.tensor([[-100, 5, 6]]), _accel(1))
    assert out is loss and value == loss.item()
