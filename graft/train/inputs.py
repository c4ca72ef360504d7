"""What `graft train` reads before the LLM's weights: the image path (encoder and projector,
which give each image's token count) and every sample, validated with the LLM's tokenizer.
Read first, so a bad sample is reported before the LLM is hashed and loaded (minutes for a
large one) and before `--overwrite` removes the run it would replace; `--dry-run` reads the
same and stops there."""

from __future__ import annotations

from dataclasses import dataclass

from graft.spec import GraftSpec
from graft.train.data import Sample, prepare_samples


@dataclass
class TrainInputs:
    image_path: object  # graft.image_path.ImagePath: a fresh projector, or spec.adapter_init's
    samples: list[Sample]
    skipped: list[str]  # why each skipped sample was skipped (data.on_bad_sample: skip)
    val_samples: list[Sample]
    val_skipped: list[str]


def read_inputs(spec: GraftSpec) -> TrainInputs:
    """The spec's inputs, or GraftDataError / GraftConfigError naming the first problem."""
    from transformers import AutoConfig, AutoTokenizer

    from graft.image_path import ImagePath, llm_dir

    path = llm_dir(spec.llm.path)
    config = AutoConfig.from_pretrained(path)
    image_path = ImagePath.from_spec(spec, config.hidden_size)
    tokenizer = AutoTokenizer.from_pretrained(path)
    context = getattr(config, "max_position_embeddings", None)

    def read(data_file: str) -> tuple[list[Sample], list[str]]:
        return prepare_samples(GraftSpec.expand(data_file), GraftSpec.expand(spec.data.image_root),
                               tokenizer, image_path.image_token_count, spec.data.max_length,
                               spec.data.on_bad_sample, spec.data.system_prompt, context)

    samples, skipped = read(spec.data.train)
    val_samples, val_skipped = read(spec.data.val) if spec.data.val else ([], [])
    return TrainInputs(image_path, samples, skipped, val_samples, val_skipped)
