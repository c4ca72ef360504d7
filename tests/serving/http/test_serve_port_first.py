"""A busy port is reported before torch (or any model code) loads: seconds on a busy machine."""

import socket
import subprocess
import sys


def test_busy_port_is_reported_before_torch_is_imported(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        code = ("import sys; from graft.cli import main; "
                f"rc = main(['serve', {str(tmp_path)!r}, '--port', '{port}']); "
                "print(rc, 'torch' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.splitlines()[-1] == "2 False", out.stderr
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in out.stderr
