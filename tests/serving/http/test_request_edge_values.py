"""Values real clients send that the parser once refused or mishandled (issue 36's campaign):
nulls from the openai client, a 5000-digit integer, an upper-case `DATA:` URL, an empty stop
string, and an 8 MB message that must be refused before it is tokenized."""

import json

import pytest

from graft.serving.http.openai.openai_chat import APIError, parse_chat_request
from graft.serving.multimodal.media import MediaConfig, load_image, to_data_url


def _raw(**over) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       **over}).encode()


def test_null_means_absent_everywhere():
    # the openai client sends explicit nulls for parameters left at NOT_GIVEN in some paths
    req = parse_chat_request(_raw(logprobs=None, n=None, stream=None, ignore_eos=None,
                                  stream_options=None, stop=None, top_logprobs=None,
                                  messages=[{"role": "user", "content": "hi", "name": None}]))
    assert (req.logprobs, req.n, req.stream, req.ignore_eos) == (False, 1, False, False)
    assert req.num_logprobs() is None and req.stop_list() == []
    with pytest.raises(APIError) as err:  # a required field sent as null is still missing
        parse_chat_request(_raw(model=None))
    assert err.value.param == "model"


def test_an_integer_over_4300_digits_is_a_400():
    raw = _raw()[:-1] + b', "max_tokens": ' + b"9" * 5000 + b"}"
    with pytest.raises(APIError) as err:
        parse_chat_request(raw)
    assert err.value.status == 400 and "4300" in err.value.message


@pytest.mark.parametrize("stop", [[""], "", ["ok", ""]])
def test_an_empty_stop_string_names_stop(stop):
    with pytest.raises(APIError) as err:
        parse_chat_request(_raw(stop=stop))
    assert err.value.status == 400 and err.value.param.startswith("stop")
    assert "SamplingParams" not in err.value.message and "empty" in err.value.message


def test_upper_case_data_url_scheme():
    from PIL import Image

    url = to_data_url(Image.new("RGB", (4, 3), (1, 2, 3)))
    for spelling in ("DATA:" + url[5:], "Data:IMAGE/PNG;BASE64," + url.partition(",")[2]):
        assert load_image(spelling, MediaConfig()).width == 4


def test_min_p_is_vllms_field_in_range():
    assert parse_chat_request(_raw(min_p=0.1)).min_p == 0.1
    for bad in (-0.1, 1.5):
        with pytest.raises(APIError) as err:
            parse_chat_request(_raw(min_p=bad))
        assert err.value.status == 400 and err.value.param == "min_p"
