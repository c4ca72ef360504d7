"""What every `graft bench` command checks about its flags, in one place: argparse types with
ranges (a bad value is one argparse line naming the flag and the valid range, never a
traceback from deep in a measurement), the output file, a MIN MAX pair, and a server URL.

Number ranges come from graft.cli_types.number_in, which also refuses NaN and infinity."""

from __future__ import annotations

import argparse
from urllib.parse import urlsplit

from graft.cli_types import number_in

positive_int = number_in(int, low=1)
count = number_in(int, low=0)  # 0 allowed: "none" / "skip"
positive = number_in(float, low=0.0, low_open=True)  # seconds, rates, sizes in MB
non_negative = number_in(float, low=0.0)
fraction = number_in(float, low=0.0, high=1.0)


def int_list(text: str) -> list[int]:
    """A `type=` for comma-separated counts >= 1 (--rows 1,4,32)."""
    values = [w.strip() for w in text.split(",") if w.strip()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r} names no value: give counts >= 1, "
                                         "comma-separated (e.g. 1,4,32)")
    try:
        return [positive_int(w) for w in values]
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err} (comma-separated counts >= 1, e.g. "
                                         "1,4,32)") from None


def out_file(text: str) -> str:
    """A `type=` for --out: a file path that can be written (checked before the measurement,
    which may take minutes). An existing file there is replaced: a bench result is rerun."""
    from graft.io import OutputPathError, check_output_path

    if not text:  # --out "": no file (bench kernels' default)
        return text
    try:
        check_output_path(text, "file")
    except OutputPathError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def http_url(text: str) -> str:
    """A `type=` for a server's base URL: http(s)://host[:port][/path]."""
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL ({err}); use e.g. "
                                         "http://127.0.0.1:8000") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL; use e.g. "
                                         "http://127.0.0.1:8000")
    return text


def check_min_max(flag: str, pair) -> None:
    """A `nargs=2` MIN MAX flag: MIN must not exceed MAX."""
    from graft.errors import GraftConfigError

    low, high = pair
    if low > high:
        raise GraftConfigError(f"{flag} {low} {high}: MIN is above MAX; give MIN MAX with "
                               f"MIN <= MAX (e.g. {flag} {high} {low})")


async def server_model(http, url: str, model: str | None) -> str:
    """GET URL/v1/models before any load (so an unreachable or wrong server is one line, not an
    httpx traceback); returns `model`, or the server's first model when it is None."""
    import httpx

    from graft.errors import GraftError

    try:
        resp = await http.get(url + "/v1/models")
        resp.raise_for_status()
        names = [m["id"] for m in resp.json()["data"]]
    except httpx.HTTPError as err:
        raise GraftError(f"{url}: no answer from {url}/v1/models ({type(err).__name__}: "
                         f"{err or 'no detail'}); start `graft serve` there or pass its URL") from None
    except (ValueError, KeyError, TypeError) as err:
        raise GraftError(f"{url}/v1/models is not an OpenAI model list ({type(err).__name__}: "
                         f"{err}); is this an OpenAI-compatible server?") from None
    if model is None and not names:
        raise GraftError(f"{url}/v1/models lists no model; load one or pass --model")
    return model or names[0]
