"""Every graft must reference the same LLM: the sha256 recorded at training is checked, and
a run dir built on another LLM (or on weights that changed since) is refused, naming both."""

import shutil

import pytest
import yaml

from graft.errors import GraftConfigError
from graft.io import weights_sha256
from graft.serving import Engine
from graft.serving.multimodal.grafts import check_same_llm, parse_graft_arg, read_runs


def _copy_run(src, dst, **llm):
    shutil.copytree(src, dst)
    raw = yaml.safe_load((dst / "graft.yaml").read_text())
    raw["llm"].update(llm)
    (dst / "graft.yaml").write_text(yaml.safe_dump(raw))
    return dst


def test_refuses_a_run_trained_on_another_llm(graft_runs, qwen_trained_run, tiny_llama):
    qwen_sha = yaml.safe_load((qwen_trained_run / "graft.yaml").read_text())["llm"]["sha256"]
    llama_sha = weights_sha256(tiny_llama)
    assert qwen_sha and qwen_sha != llama_sha  # graft.train.loop recorded the digest it trained on
    with pytest.raises(GraftConfigError) as err:
        Engine.from_grafts({"sig": graft_runs["sig"], "qwen": qwen_trained_run})
    msg = str(err.value)
    for part in (str(graft_runs["sig"]), str(qwen_trained_run), qwen_sha, llama_sha):
        assert part in msg


def test_a_trained_run_serves_alone_through_from_grafts(qwen_trained_run):
    from PIL import Image

    from graft.serving import EngineConfig, SamplingParams

    engine = Engine.from_grafts({"q": qwen_trained_run}, EngineConfig(num_kv_blocks=32))
    recorded = yaml.safe_load((qwen_trained_run / "graft.yaml").read_text())["llm"]["sha256"]
    assert engine.grafts.names == ["q"] and engine.grafts.llm_sha256 == recorded
    ids, mm = engine.grafts["q"].prepare_chat(
        [{"role": "user", "content": "<image>\nWhat color?"}], [Image.new("RGB", (32, 32))])
    engine.add_request("r", prompt_token_ids=ids, mm_inputs=mm,
                       sampling_params=SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    assert len(outs[0].token_ids) == 3


def test_refuses_weights_changed_since_training(graft_runs, tmp_path):
    stale = _copy_run(graft_runs["clip"], tmp_path / "stale", sha256="0" * 64)
    with pytest.raises(GraftConfigError, match="0{64}.*hashes to") as err:
        check_same_llm(read_runs({"stale": stale}))
    assert "stale" in str(err.value)


def test_refuses_an_llm_dir_that_is_another_model(graft_runs, tiny_llm_factory):
    with pytest.raises(GraftConfigError, match="hashes to"):
        check_same_llm(read_runs({"sig": graft_runs["sig"]}), llm=tiny_llm_factory("qwen2"))


def test_a_copy_of_the_same_llm_is_accepted_unless_its_tokenizer_differs(
        graft_runs, tiny_llama, tmp_path):
    copy = shutil.copytree(tiny_llama, tmp_path / "llama_copy")
    moved = _copy_run(graft_runs["clip"], tmp_path / "moved", path=str(copy))
    path, sha = check_same_llm(read_runs({"sig": graft_runs["sig"], "moved": moved}))
    assert sha == weights_sha256(tiny_llama)
    cfg = copy / "tokenizer_config.json"
    cfg.write_text(cfg.read_text().replace("<|im_end|>", "<|im_end|>", 1) + " ")
    with pytest.raises(GraftConfigError, match="different tokenizer files"):
        check_same_llm(read_runs({"sig": graft_runs["sig"], "moved": moved}))


def test_bad_run_dirs_and_names(graft_runs, tmp_path):
    lora = shutil.copytree(graft_runs["sig"], tmp_path / "lora_run")
    (lora / "lora").mkdir()
    with pytest.raises(GraftConfigError, match="LoRA"):
        read_runs({"l": lora})
    with pytest.raises(GraftConfigError, match="not a run dir"):
        read_runs({"x": tmp_path})
    with pytest.raises(GraftConfigError, match="no grafts"):
        read_runs({})
    with pytest.raises(GraftConfigError, match="graft name"):
        parse_graft_arg("bad name=runs/x")
    assert parse_graft_arg(" sig = runs/a=b ") == ("sig", "runs/a=b")
