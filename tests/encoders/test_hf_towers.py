"""SigLIP / CLIP towers: exact hidden_states parity, HF-processor parity, token counts, bad input."""

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from graft.encoders import EncoderConfig, build_encoder
from graft.errors import GraftConfigError, GraftDataError

FAMILIES = ["siglip", "clip"]


def _images():
    rng = np.random.RandomState(0)
    return [Image.fromarray(rng.randint(0, 255, (40, 56, 3), dtype=np.uint8)),
            Image.fromarray(rng.randint(0, 255, (70, 30, 3), dtype=np.uint8)),
            Image.new("L", (33, 33), 90)]  # grayscale -> converted to RGB


def _reference(family, path):
    import transformers as tf

    model_cls = tf.SiglipVisionModel if family == "siglip" else tf.CLIPVisionModel
    return model_cls.from_pretrained(path).eval(), tf.AutoImageProcessor.from_pretrained(path)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def tower_dir(family, request):
    return request.getfixturevalue(f"tiny_{family}_dir")


@pytest.fixture(scope="module")
def reference(family, tower_dir):
    return _reference(family, tower_dir)


@pytest.mark.parametrize("layer", [-2, -1, 0, 1])
def test_feature_layer_equals_hf_hidden_states(family, tower_dir, reference, layer):
    enc = build_encoder(EncoderConfig(kind=family, path=tower_dir, feature_layer=layer))
    model, processor = reference
    images = [img.convert("RGB") for img in _images()]
    inputs = enc.preprocess(images)
    feats = enc.encode(inputs)
    with torch.no_grad():
        pv = processor(images=images, return_tensors="pt")["pixel_values"]
        hs = model(pixel_values=pv, output_hidden_states=True).hidden_states[layer]
    skip = 1 if family == "clip" else 0  # CLIP drops CLS, SigLIP has none
    assert len(feats) == len(images)
    for i, f in enumerate(feats):
        assert f.shape == (enc.num_tokens(*images[i].size), enc.hidden_size)
        assert torch.equal(f, hs[i, skip:])


def test_preprocessing_equals_hf_processor(family, tower_dir, reference):
    enc = build_encoder(EncoderConfig(kind=family, path=tower_dir))
    _, processor = reference
    images = _images()
    inputs = enc.preprocess(images)
    expected = processor(images=[im.convert("RGB") for im in images], return_tensors="pt")["pixel_values"]
    assert torch.equal(inputs.pixel_values, expected)
    assert inputs.image_sizes == [im.size for im in images]
    assert inputs.grids == [(4, 4)] * 3
    # Independent check of the normalization: a flat colour maps to (c/255 - mean) / std.
    flat = enc.preprocess([Image.new("RGB", (50, 20), (255, 0, 128))]).pixel_values[0]
    mean, std = torch.tensor(processor.image_mean), torch.tensor(processor.image_std)
    want = (torch.tensor([255.0, 0.0, 128.0]) / 255 - mean) / std
    assert torch.allclose(flat.mean(dim=(1, 2)), want, atol=1e-5)


def test_full_checkpoint_dir_gives_same_features(family, tower_dir, request):
    full_dir = request.getfixturevalue(f"tiny_{family}_full_dir")
    images = _images()
    a = build_encoder(EncoderConfig(kind=family, path=tower_dir))
    b = build_encoder(EncoderConfig(kind=family, path=full_dir))
    for x, y in zip(a.encode(a.preprocess(images)), b.encode(b.preprocess(images))):
        assert torch.equal(x, y)


def test_clip_keeps_cls_when_asked(tiny_clip_dir):
    model, processor = _reference("clip", tiny_clip_dir)
    enc = build_encoder(EncoderConfig(kind="clip", path=tiny_clip_dir, drop_prefix=False))
    assert enc.num_tokens(10, 10) == 17
    img = _images()[0]
    feats = enc.encode(enc.preprocess([img]))[0]
    with torch.no_grad():
        hs = model(pixel_values=processor(images=[img], return_tensors="pt")["pixel_values"],
                   output_hidden_states=True).hidden_states[-2]
    assert feats.shape == (17, 32) and torch.equal(feats, hs[0])


def test_processor_config_json_layout(tiny_clip_dir, tmp_path):
    # A full processor saved by transformers 5 writes processor_config.json, not preprocessor_config.json.
    import transformers as tf

    from tests.tiny_llm import build_tokenizer

    dest = tmp_path / "clip_proc"
    shutil.copytree(tiny_clip_dir, dest)
    image_processor = tf.AutoImageProcessor.from_pretrained(tiny_clip_dir)
    (dest / "preprocessor_config.json").unlink()
    tf.CLIPProcessor(image_processor=image_processor, tokenizer=build_tokenizer(tmp_path / "tok")).save_pretrained(dest)
    a = build_encoder(EncoderConfig(kind="clip", path=tiny_clip_dir))
    b = build_encoder(EncoderConfig(kind="clip", path=str(dest)))
    assert a.preprocess_identity() == b.preprocess_identity()
    assert torch.equal(a.preprocess(_images()).pixel_values, b.preprocess(_images()).pixel_values)


def test_image_size_override_interpolates(tiny_siglip_dir):
    enc = build_encoder(EncoderConfig(kind="siglip", path=tiny_siglip_dir, image_size=48))
    assert enc.token_grid(100, 50) == (6, 6) and enc.num_tokens(100, 50) == 36
    inputs = enc.preprocess(_images()[:1])
    assert inputs.pixel_values.shape == (1, 3, 48, 48)
    assert enc.encode(inputs)[0].shape == (36, 32)


def test_frozen_eval_and_identity(family, tower_dir):
    enc = build_encoder(EncoderConfig(kind=family, path=tower_dir))
    assert not any(p.requires_grad for p in enc.parameters())
    enc.train()
    assert not enc.training
    again = build_encoder(EncoderConfig(kind=family, path=tower_dir))
    assert enc.identity() == again.identity()
    ident = json.loads(enc.identity())
    assert ident["kind"] == family and ident["weights"]["model.safetensors"]
    other = build_encoder(EncoderConfig(kind=family, path=tower_dir, feature_layer=-1))
    assert other.identity() != enc.identity()
    assert other.preprocess_identity() == enc.preprocess_identity()
    assert enc.to(torch.bfloat16).identity() != again.identity()  # dtype changes features
    assert enc.encode(enc.preprocess(_images()[:1]))[0].dtype == torch.bfloat16


def test_bad_inputs(tiny_siglip_dir, tiny_clip_dir, tmp_path):
    with pytest.raises(GraftConfigError, match="encoder.path is required"):
        build_encoder(EncoderConfig(kind="siglip"))
    with pytest.raises(GraftConfigError, match="no config.json"):
        build_encoder(EncoderConfig(kind="clip", path=str(tmp_path / "nowhere")))
    with pytest.raises(GraftConfigError, match="encoder.kind is 'clip'"):
        build_encoder(EncoderConfig(kind="clip", path=tiny_siglip_dir))
    with pytest.raises(GraftConfigError, match="feature_layer=9 is out of range"):
        build_encoder(EncoderConfig(kind="siglip", path=tiny_siglip_dir, feature_layer=9))
    no_proc = tmp_path / "no_proc"
    shutil.copytree(tiny_clip_dir, no_proc)
    (no_proc / "preprocessor_config.json").unlink()
    with pytest.raises(GraftConfigError, match="preprocessor_config.json"):
        build_encoder(EncoderConfig(kind="clip", path=str(no_proc)))
    enc = build_encoder(EncoderConfig(kind="siglip", path=tiny_siglip_dir))
    with pytest.raises(GraftDataError, match="image 1 is a str"):
        enc.preprocess([Image.new("RGB", (8, 8)), "cat.png"])
    with pytest.raises(GraftDataError, match="non-empty list"):
        enc.preprocess([])
    png = tmp_path / "cut.png"
    Image.new("RGB", (64, 64), (1, 2, 3)).save(png)
    png.write_bytes(png.read_bytes()[:60])  # header intact, pixel data cut off
    with pytest.raises(GraftDataError, match="image 0 cannot be decoded"):
        enc.preprocess([Image.open(png)])
