"""CLI fit and finish: examples and defaults in every --help, "did you mean", group commands
that list their subcommands, light top-level imports."""

import subprocess
import sys
from pathlib import Path

import pytest

from graft.cli import COMMANDS, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_help_has_an_example(command, capsys):
    assert main([*command.split(), "--help"]) == 0
    out = capsys.readouterr().out
    assert "example" in out and f"graft {command}" in out.split("example", 1)[1]


def test_top_help_has_examples(capsys):
    assert main(["--help"]) == 0
    assert "examples:\n  graft train" in capsys.readouterr().out


def test_help_shows_defaults(capsys):
    assert main(["chat", "--help"]) == 0
    assert "(default: 64)" in capsys.readouterr().out


def test_did_you_mean(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'. Did you mean train?" in capsys.readouterr().err
    assert main(["bench", "serv"]) == 2
    assert "Did you mean serve?" in capsys.readouterr().err
    assert main(["train", "x.yaml", "--dryrun"]) == 2
    assert "--dryrun: Did you mean --dry-run?" in capsys.readouterr().err


def test_group_without_subcommand_lists_them(capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    for sub in ("engine", "serve", "grafts", "kernels", "train"):
        assert f"  {sub} " in out


def test_top_level_imports_stay_light():
    code = ("import sys, graft; assert 'torch' not in sys.modules, 'torch loaded'; "
            "from graft import GraftedModel, GraftSpec, Engine, EngineConfig, SamplingParams; "
            "print(GraftSpec.__name__, Engine.__name__, SamplingParams.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["GraftSpec", "Engine", "SamplingParams"]


def test_help_needs_no_torch():
    """`graft train --help` and `graft eval compare --help` print without importing torch (it took
    3-6 s on a busy machine); `graft.train.train` still loads when asked for."""
    code = ("import sys; from graft.cli import main; main(['train', '--help']); "
            "main(['eval', 'compare', '--help']); "
            "assert 'torch' not in sys.modules, 'torch loaded'; "
            "from graft.train import train; print('torch' in sys.modules, train.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == ["True", "graft.train.loop"]


def test_py_typed_is_shipped():
    from importlib.resources import files

    assert files("graft").joinpath("py.typed").is_file()
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert '"graft" = ["py.typed"]' in pyproject.read_text()
