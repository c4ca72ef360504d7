"""Request validation and image loading: every bad input becomes a named 4xx APIError."""

import base64
import io
import json

import pytest
from PIL import Image

from graft.errors import RequestError
from graft.serving.multimodal.media import MediaConfig, decode_image, load_image, to_data_url
from graft.serving.http.openai.openai_chat import APIError, parse_chat_request, to_chat_messages


def _body(**over):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(over)
    return json.dumps(body).encode()


def _img(w=8, h=6, color=(200, 10, 10)):
    return Image.new("RGB", (w, h), color)


@pytest.mark.parametrize("raw,param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (_body(messages=[]), "messages"),
    (_body(temperature="hot"), "temperature"),
    (_body(top_p=0), "top_p"),
    (_body(max_tokens=0), "max_tokens"),
    (_body(n=0), "n"),
    (_body(messages=[{"role": "bob", "content": "x"}]), "messages[0].role"),
    (_body(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (_body(messages=[{"role": "user", "content": [{"type": "image_url",
                                                   "image_url": {"url": 5}}]}]),
     "messages[0].content[0].image_url.url"),
    (_body(messages=[{"role": "user", "content": [{"type": "audio"}]}]), "messages[0].content"),
])
def test_bad_requests_name_the_field(raw, param):
    with pytest.raises(APIError) as info:
        parse_chat_request(raw)
    err = info.value
    assert err.status == 400 and err.param == param
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


def test_messages_become_markers_in_order():
    req = parse_chat_request(_body(messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:a"}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": "data:b"}}]}]))
    messages, refs = to_chat_messages(req.messages)
    assert messages[1]["content"] == "<image>\nand\n<image>"
    assert [u for _, u in refs] == ["data:a", "data:b"]
    assert refs[1][0] == "messages[1].content[2].image_url.url"
    literal = parse_chat_request(_body(messages=[{"role": "user", "content": "a <image> b"}]))
    with pytest.raises(APIError, match="literal") as err:
        to_chat_messages(literal.messages)
    assert (err.value.param, err.value.code) == ("messages[0].content", "invalid_value")
    shown = parse_chat_request(_body(messages=[{"role": "assistant", "content": [
        {"type": "image_url", "image_url": {"url": "data:a"}}]}]))
    with pytest.raises(APIError, match="images are only accepted in user messages") as err:
        to_chat_messages(shown.messages)
    assert (err.value.param, err.value.code) == ("messages[0].content[0]", "invalid_value")


def test_data_url_roundtrip_and_hash_ignores_encoding():
    cfg = MediaConfig()
    png = load_image(to_data_url(_img()), cfg)
    bmp = load_image(to_data_url(_img(), fmt="BMP"), cfg)
    assert (png.width, png.height) == (8, 6) and png.image.mode == "RGB"
    assert png.content_hash == bmp.content_hash  # same pixels, different container
    assert load_image(to_data_url(_img(color=(0, 0, 1))), cfg).content_hash != png.content_hash


@pytest.mark.parametrize("url,code", [
    ("data:image/png;base64,@@@notbase64", "invalid_base64"),
    ("data:image/png," + "abc", "invalid_image_url"),
    ("data:text/plain;base64," + base64.b64encode(b"hello").decode(), "invalid_image_url"),
    ("data:image/png;base64," + base64.b64encode(b"definitely not an image").decode(),
     "invalid_image"),
    ("ftp://host/x.png", "invalid_image_url"),
    ("http://127.0.0.1:9/x.png", "remote_media_disabled"),
    ("/etc/passwd", "local_media_disabled"),
])
def test_bad_image_urls(url, code):
    with pytest.raises(RequestError) as info:
        load_image(url, MediaConfig())
    assert info.value.code == code and 400 <= APIError.from_request(info.value).status < 500


def test_truncated_image_is_rejected():
    buf = io.BytesIO()
    _img(64, 64).save(buf, format="PNG")
    with pytest.raises(RequestError) as info:
        decode_image(buf.getvalue()[:60], MediaConfig())
    assert info.value.code == "invalid_image"


def test_pixel_and_byte_limits():
    with pytest.raises(RequestError) as info:
        load_image(to_data_url(_img(64, 64)), MediaConfig(max_image_pixels=1000))
    assert APIError.from_request(info.value).status == 413 and "pixels" in info.value.message
    with pytest.raises(RequestError) as info:
        load_image(to_data_url(_img(64, 64)), MediaConfig(max_image_bytes=20))
    assert APIError.from_request(info.value).status == 413 and "bytes" in info.value.message


def test_local_paths_only_under_the_allowed_root(tmp_path):
    root = tmp_path / "media"
    root.mkdir()
    _img().save(root / "ok.png")
    _img().save(tmp_path / "secret.png")
    (root / "link.png").symlink_to(tmp_path / "secret.png")
    cfg = MediaConfig(allowed_local_media_path=str(root))
    assert load_image(str(root / "ok.png"), cfg).width == 8
    assert load_image(f"file://{root}/ok.png", cfg).width == 8
    for bad in (str(tmp_path / "secret.png"), f"{root}/../secret.png", str(root / "link.png")):
        with pytest.raises(RequestError) as info:
            load_image(bad, cfg)
        assert info.value.code == "local_media_forbidden"
    with pytest.raises(RequestError) as info:
        load_image(str(root / "missing.png"), cfg)
    assert info.value.code == "image_not_found"
