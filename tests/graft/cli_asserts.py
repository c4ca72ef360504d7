"""One check for every CLI mistake test: exit 2, the message's parts, no traceback."""

from graft.cli import main


def fails(capsys, argv, *needles) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err
    return err
