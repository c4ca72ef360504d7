"""How many `<image>` positions an image takes, from an exported dir's files alone.

vLLM sizes every image's placeholder run in its front-end process (the API server), which
must not load encoder weights. The count is graft's own: the encoder's token grid, then the
projector's `num_output_tokens`, with the projector built on the meta device (its code, none
of its weights). Fixed-resolution encoders have one grid, recorded at export from the real
encoder; MoonViT's grid follows the image size through its (weight-free) processor config.
No vllm import here: `graft export` and graft's own tests use this too.
"""

from __future__ import annotations

import json
from pathlib import Path

from graft.errors import GraftConfigError

GRAFT_SUBDIR = "graft"  # inside an export: a run dir (graft.yaml, adapter) + the encoder files
CONFIG_KEY = "graft"  # the block of config.json this plugin reads


def read_export_meta(export_dir: str | Path) -> dict:
    """config.json's `graft` block, or an error saying the dir is not a vLLM export."""
    path = Path(export_dir) / "config.json"
    try:
        meta = json.loads(path.read_text()).get(CONFIG_KEY)
    except (OSError, ValueError) as err:
        raise GraftConfigError(f"{path}: cannot read it ({err}); export the run with "
                               "`graft export RUN OUT --format vllm`") from None
    if not isinstance(meta, dict):
        raise GraftConfigError(f"{path} has no {CONFIG_KEY!r} block: it is not a graft export; "
                               "write one with `graft export RUN OUT --format vllm`")
    return meta


def load_export_spec(export_dir: str | Path):
    """The run dir's spec as exported (relative paths resolved against the export)."""
    from graft.spec import GraftSpec

    return GraftSpec.load(Path(export_dir) / GRAFT_SUBDIR / "graft.yaml")


class ImageTokenCounter:
    """(width, height) -> number of image positions, without any weights."""

    def __init__(self, meta: dict, spec):
        """meta: config.json's `graft` block; spec: the export's GraftSpec."""
        import torch

        from graft.adapters import build_adapter

        self.prefix_tokens = int(meta["prefix_tokens"])
        self.fixed_grid = tuple(meta["token_grid"]) if meta.get("token_grid") else None
        self.moonvit = None
        if self.fixed_grid is None:
            self.moonvit = _moonvit_processor(spec)
        with torch.device("meta"):
            self.projector = build_adapter(spec.adapter_config(), int(meta["d_vision"]),
                                           int(meta["d_model"]))

    @classmethod
    def from_export(cls, export_dir: str | Path) -> "ImageTokenCounter":
        return cls(read_export_meta(export_dir), load_export_spec(export_dir))

    def grid(self, width: int, height: int) -> tuple[int, int]:
        if self.fixed_grid is not None:
            return self.fixed_grid
        from graft.encoders.moonvit_processor import token_grid

        return token_grid(width, height, self.moonvit)

    def __call__(self, width: int, height: int) -> int:
        gh, gw = grid = self.grid(width, height)
        return self.projector.num_output_tokens(gh * gw + self.prefix_tokens, grid=grid)


def _moonvit_processor(spec):
    from graft.encoders.moonvit import read_processor_config
    from graft.encoders.moonvit_weights import read_vision_config

    cfg = spec.encoder_config()
    if cfg.kind != "moonvit":
        raise GraftConfigError(f"encoder.kind={cfg.kind!r}: the export records no token grid; "
                               "re-export the run with `graft export RUN OUT --format vllm`")
    vision, _ = read_vision_config(Path(cfg.path))
    return read_processor_config(cfg.path, vision, cfg.max_image_tokens)


def encoder_geometry(image_path) -> dict:
    """What the export records about a loaded encoder so that ImageTokenCounter can count
    without it: one token grid (None where it follows the image size), prefix tokens, widths."""
    encoder = image_path.encoder
    grids = {encoder.token_grid(w, h) for w, h in ((37, 23), (23, 37), (640, 480))}
    return {"token_grid": list(grids.pop()) if len(grids) == 1 and encoder.kind != "moonvit" else None,
            "prefix_tokens": int(encoder.kept_prefix_tokens),
            "d_vision": int(image_path.projector.d_vision),
            "d_model": int(image_path.projector.d_model)}
