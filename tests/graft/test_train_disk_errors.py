"""`graft train` when the disk refuses: a full disk (ENOSPC) while the run is written, and an
output_dir on a kernel pseudo-filesystem, are one line each (exit 2, no traceback), and no
half-written file is left where a later command would trust it."""

import errno
import os

import pytest
import yaml

from tests.graft.cli_asserts import fails


def _config(tmp_path, spec):
    cfg = tmp_path / "spec.yaml"
    cfg.write_text(yaml.safe_dump(spec.to_dict()))
    return str(cfg)


@pytest.mark.parametrize("where", ["adapter", "any_file"])
def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(make_spec, tmp_path, capsys,
                                                                monkeypatch, where):
    import graft.io

    out = tmp_path / "run"
    cfg = _config(tmp_path, make_spec(max_steps=2))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if where == "adapter":  # the projector's weights, whatever writes them
        monkeypatch.setattr(graft.io.os, "fsync", full)
    else:  # every file the run opens for writing (metrics.jsonl appends too)
        real_open = open

        def no_space(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax") and str(out) in str(file):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
            return real_open(file, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", no_space)
    err = fails(capsys, ["train", cfg, "--set", f"output_dir={out}"], "No space left on device",
                "--resume")
    assert err.count("graft train: error:") == 1, err
    leftovers = [p.name for p in out.rglob("*") if ".tmp" in p.name or p.name.startswith(".")]
    assert leftovers == [] and not (out / "adapter.safetensors").exists()


@pytest.mark.parametrize("root", ["/proc", "/sys"])
def test_an_output_dir_under_proc_or_sys_is_one_line(make_spec, tmp_path, capsys, root):
    cfg = _config(tmp_path, make_spec(max_steps=1))
    err = fails(capsys, ["train", cfg, "--set", f"output_dir={root}/graft-run"], "output_dir",
                f"{root}/graft-run")
    assert err.count("graft train: error:") == 1, err
    assert not os.path.exists(f"{root}/graft-run")
