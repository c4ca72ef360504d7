"""quant.json carries its format version: a file written by another version of graft is refused
naming the version found and the one supported, never read with a meaning it may not have."""

import json

import pytest

from graft.errors import GraftConfigError
from graft.serving.models.quant_config import FORMAT, QuantConfig


def test_the_written_format_reads_back(tmp_path):
    path = tmp_path / "quant.json"
    path.write_text(json.dumps(QuantConfig.parse("int8").to_dict()))
    assert QuantConfig.parse(str(path)).default.name == "int8"
    assert QuantConfig.parse({"default": "int8"}).default.name == "int8"  # hand-written: no format


@pytest.mark.parametrize("version", ["graft-quant/2", "graft-quant/0", "gptq", 2, None])
def test_an_unknown_format_is_refused(tmp_path, version):
    path = tmp_path / "quant.json"
    path.write_text(json.dumps({"format": version, "default": "int8"}))
    with pytest.raises(GraftConfigError) as err:
        QuantConfig.parse(str(path))
    assert repr(version) in str(err.value) and FORMAT in str(err.value)
