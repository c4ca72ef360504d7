"""train.feature_cache naming a file (or a path under one) is one line from --dry-run and the
real run alike, before anything loads (was: a dry run that passed, then NotADirectoryError)."""

import pytest

from graft.train.feature_cache import FeatureCache
from graft.errors import GraftConfigError
from tests.graft.cli_asserts import fails
from tests.graft.test_train_cli_guards import _config


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize("under", ["", "cache"])
def test_feature_cache_on_a_file_is_refused_first(make_spec, tmp_path, capsys, dry_run, under):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    cache = blocker / under if under else blocker
    cfg = _config(tmp_path, make_spec(), **{"train.feature_cache": str(cache)})
    fails(capsys, ["train", cfg, *(["--dry-run"] if dry_run else [])],
          f"train.feature_cache='{cache}' cannot hold the cache (output {cache}",
          f"{blocker} is a file, not a folder", "point it at a folder you can write")
    assert blocker.read_text() == "mine" and not (tmp_path / "run").exists()


def test_feature_cache_class_checks_its_root(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(GraftConfigError, match="is a file"):
        FeatureCache(tmp_path / "f", "identity")
    assert FeatureCache(tmp_path / "new" / "cache", "identity").dir.is_dir()
