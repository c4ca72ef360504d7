"""graft/cli.py's last word for every command: Ctrl-C is one line and exit 130, an OSError a
path or disk caused is one line naming it; anything else keeps its traceback."""

from __future__ import annotations

import errno
import sys
import types

import pytest

from graft import cli


@pytest.fixture
def fake_command(monkeypatch):
    """Registers `graft fakecmd`, whose run() raises what the test puts in `raised`."""
    raised: list[BaseException] = []
    module = types.ModuleType("graft_fake_cmd")
    module.add_arguments = lambda parser: None

    def run(args):
        raise raised[0]

    module.run = run
    monkeypatch.setitem(sys.modules, "graft_fake_cmd", module)
    monkeypatch.setitem(cli.COMMANDS, "fakecmd", ("graft_fake_cmd", "a test command"))
    return raised


def test_ctrl_c_in_any_command_is_one_line_and_130(fake_command, capsys):
    fake_command.append(KeyboardInterrupt())
    assert cli.main(["fakecmd"]) == 130
    err = capsys.readouterr().err
    assert err == f"graft fakecmd: interrupted; {cli.INTERRUPTED_HINT}\n"


def test_ctrl_c_while_importing_the_command_is_one_line(monkeypatch, capsys):
    def slow_import(name):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", slow_import)
    assert cli.main(["data", "quickstart"]) == 130
    assert "graft data quickstart: interrupted;" in capsys.readouterr().err


def test_a_path_problem_is_one_line_naming_the_path(fake_command, capsys):
    fake_command.append(PermissionError(errno.EACCES, "Permission denied", "/srv/out/x.json"))
    assert cli.main(["fakecmd"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "graft fakecmd: error: /srv/out/x.json: Permission denied" in err


def test_other_os_errors_keep_their_traceback(fake_command):
    fake_command.append(ConnectionResetError(errno.ECONNRESET, "reset"))
    with pytest.raises(ConnectionResetError):
        cli.main(["fakecmd"])
    fake_command[0] = PermissionError(errno.EACCES, "denied")  # no path: nothing to name
    with pytest.raises(PermissionError):
        cli.main(["fakecmd"])
