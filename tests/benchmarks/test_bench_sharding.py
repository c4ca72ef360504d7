"""`graft bench sharding` launches one process, 2 DDP ranks and 2 FSDP ranks on the same global
batch and reports what each rank holds."""

import json

import pytest

from graft.cli import main
from graft.spec import GraftSpec
from tests.graft.conftest import make_dataset


@pytest.mark.slow
def test_bench_sharding_cli(tiny_llm_factory, tiny_encoder_config, tmp_path, capsys):
    data = make_dataset(tmp_path / "data", n=8)
    spec = GraftSpec.from_dict({
        "encoder": tiny_encoder_config("siglip").to_dict(), "llm": {"path": str(tiny_llm_factory("qwen3_moe"))},
        "data": {"train": str(data), "image_root": str(data.parent), "max_length": 256},
        "train": {"batch_size": 2, "lr": 1e-2, "warmup_ratio": 0.0}, "output_dir": str(tmp_path / "unused")})
    spec.save(tmp_path / "graft.yaml")
    out = tmp_path / "sharding.json"
    assert main(["bench", "sharding", str(tmp_path / "graft.yaml"), "--steps", "2", "--repeats", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    whole = result["one"]["llm_param_bytes"]
    assert result["one"]["llm_bytes_per_rank_max"] == result["ddp"]["llm_bytes_per_rank_max"] == whole
    assert result["fsdp"]["llm_bytes_per_rank_max"] <= 0.6 * whole
    for v in ("ddp", "fsdp"):
        assert result[v]["ranks"] == 2 and result[v]["max_loss_rel_diff_vs_one"] <= 1e-5
        assert result[v]["samples_per_s"]["median"] > 0
    assert "fsdp x2" in capsys.readouterr().out
