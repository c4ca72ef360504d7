"""The shared helpers: atomic file/dir writes, digests, shard discovery, the run-dir layout."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from graft.errors import GraftConfigError


def test_atomic_write_dir_swaps_whole_dirs_and_leaves_nothing_on_failure(tmp_path):
    from graft.io import atomic_write_dir

    out = tmp_path / "out"
    atomic_write_dir(out, lambda d: (d / "a.txt").write_text("one"))
    atomic_write_dir(out, lambda d: (d / "b.txt").write_text("two"))
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]  # the old dir is gone, not merged

    def broken(d):
        (d / "half.txt").write_text("x")
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        atomic_write_dir(out, broken)
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp dir left behind


def test_atomic_write_file_keeps_the_old_file_on_failure(tmp_path):
    from graft.io import atomic_write, atomic_write_json

    path = tmp_path / "x.json"
    atomic_write_json(path, {"a": 1})
    with pytest.raises(RuntimeError):
        atomic_write(path, lambda tmp: (_ for _ in ()).throw(RuntimeError("boom")))
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_digests_agree_with_their_old_homes(tmp_path):
    import hashlib

    from graft.digests import pixel_hash, sha256_file
    from graft.encoders.weights import sha256_file as cached
    from graft.io import sha256_file as old_home
    from graft.serving.multimodal.media import pixel_hash as media_pixel_hash
    from graft.train.data import image_content_hash

    f = tmp_path / "w.bin"
    f.write_bytes(b"abc" * 1000)
    want = hashlib.sha256(b"abc" * 1000).hexdigest()
    assert sha256_file(f) == old_home(f) == cached(f) == sha256_file(f, cached=True) == want
    im = Image.new("RGB", (5, 3), (10, 20, 30))
    assert pixel_hash(im) == media_pixel_hash(im) == image_content_hash(im)
    assert pixel_hash(im.convert("RGBA")) == pixel_hash(im)  # same picture, same hash


def test_safetensors_files_index_single_or_glob(tmp_path):
    from graft.serving.models.loader import safetensors_files as loader_copy
    from graft.shards import read_weight_map, safetensors_files

    assert loader_copy is safetensors_files
    with pytest.raises(ValueError, match="model.safetensors"):
        safetensors_files(tmp_path)
    (tmp_path / "b.safetensors").write_bytes(b"")
    (tmp_path / "a.safetensors").write_bytes(b"")
    assert [p.name for p in safetensors_files(tmp_path)] == ["a.safetensors", "b.safetensors"]
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert [p.name for p in safetensors_files(tmp_path)] == ["model.safetensors"]
    assert read_weight_map(tmp_path) is None
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}}))
    assert [p.name for p in safetensors_files(tmp_path)] == ["a.safetensors", "b.safetensors"]
    assert read_weight_map(tmp_path) == {"x": "b.safetensors", "y": "a.safetensors", "z": "b.safetensors"}


def test_run_dir_layout_and_kind(tmp_path):
    from graft.adapters.checkpoint import CONFIG_NAME, WEIGHTS_NAME
    from graft.run_dir import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, RunDir, is_run_dir,
                               model_dir_kind)
    from graft.train.checkpoint import STATE_FILE

    assert (ADAPTER_WEIGHTS, ADAPTER_CONFIG) == (WEIGHTS_NAME, CONFIG_NAME)  # one layout
    assert STATE_FILE == "trainer_state.pt"
    run = RunDir(str(tmp_path))
    assert run.spec_file == tmp_path / "graft.yaml"
    assert run.adapter_weights == tmp_path / "adapter.safetensors"
    assert run.metrics_file == tmp_path / "metrics.jsonl"
    assert run.eval_dir == tmp_path / "eval"
    assert not run.has_lora and not is_run_dir(tmp_path)
    with pytest.raises(GraftConfigError, match=r"neither a run dir \(graft.yaml\) nor an HF LLM dir \(config.json\)"):
        model_dir_kind(tmp_path, what="--model")
    with pytest.raises(GraftConfigError, match="not a run dir: graft.yaml is missing"):
        RunDir.open(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert model_dir_kind(tmp_path) == "llm"
    (tmp_path / "graft.yaml").write_text("{}")
    assert model_dir_kind(tmp_path) == "run" and RunDir.open(tmp_path).path == tmp_path


def test_engine_from_pretrained_names_both_files_for_a_wrong_dir(tmp_path):
    from graft.serving import Engine

    with pytest.raises(GraftConfigError, match="graft.yaml.*config.json"):
        Engine.from_pretrained(tmp_path)
