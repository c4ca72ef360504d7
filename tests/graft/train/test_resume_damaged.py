"""--resume over a damaged newest checkpoint (an empty or cut-short trainer_state.pt, a
truncated adapter.safetensors): one log line says so and the run continues from the newest
intact checkpoint, exactly as if the damaged one had never been written; with none intact,
one line names every file."""

import json
import logging

import pytest

from graft.errors import GraftConfigError
from graft.train.loop import train


class Interrupt(Exception):
    pass


def losses(run_dir):
    return [json.loads(ln)["loss"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]


def interrupted_run(make_spec, tmp_path, name):
    """A 5-step run stopped after step 3: checkpoints step 2 and step 3 (keep_checkpoints 2)."""
    spec = make_spec(max_steps=5, save_every=1)
    spec.output_dir = str(tmp_path / name)

    def stop(step, loss):
        if step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(spec, on_step=stop)
    return spec, tmp_path / name / "checkpoints"


def empty(path):
    path.write_bytes(b"")


def cut(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("damage, file", [(empty, "trainer_state.pt"), (cut, "trainer_state.pt"),
                                          (cut, "adapter.safetensors")])
def test_resume_falls_back_to_the_newest_intact_checkpoint(make_spec, tmp_path, caplog, damage,
                                                           file):
    clean = make_spec(max_steps=5, save_every=1)
    clean.output_dir = str(tmp_path / "clean")
    ref = losses(train(clean))
    spec, ckpts = interrupted_run(make_spec, tmp_path, "broken")
    damage(ckpts / "step_00000003" / file)
    with caplog.at_level(logging.INFO, logger="graft.train.loop"):
        run = train(spec, resume=True)
    warned = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0]
    assert f"skipping damaged checkpoint step_00000003: {ckpts / 'step_00000003' / file}" \
        in warned[0]
    assert any("resumed from" in r.getMessage() and "step_00000002" in r.getMessage()
               for r in caplog.records)
    assert losses(run) == pytest.approx(ref, abs=0, rel=1e-6)  # steps 3-5 trained again


def test_resume_with_no_intact_checkpoint_names_every_file(make_spec, tmp_path):
    spec, ckpts = interrupted_run(make_spec, tmp_path, "broken")
    empty(ckpts / "step_00000003" / "trainer_state.pt")
    cut(ckpts / "step_00000002" / "adapter.safetensors")
    with pytest.raises(GraftConfigError) as err:
        train(spec, resume=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith("--resume: no intact checkpoint under")
    assert f"{ckpts / 'step_00000003' / 'trainer_state.pt'} is not a readable trainer state " \
           "(EOFError" in message
    assert f"{ckpts / 'step_00000002' / 'adapter.safetensors'} is not a readable safetensors" \
        in message
    assert message.endswith("start the run again with --overwrite")
