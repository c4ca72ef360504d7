"""graft inspect --image-size: a size no image can have is refused in one line, before loading."""

import pytest

from tests.graft.cli_asserts import fails


@pytest.mark.parametrize("size", ["0x0", "0x224", "224x0", "-3x4", "224", "axb"])
def test_bad_image_sizes(size, tmp_path, capsys):
    fails(capsys, ["inspect", str(tmp_path), f"--image-size={size}"],
          f"graft inspect: error: --image-size {size!r}")
