"""Exceptions with messages that name the field or sample and the fix.

A leaf module (imports nothing of ours) so every subpackage may raise these.
"""


class GraftError(Exception):
    """Base of every error graft raises on purpose."""


class GraftConfigError(GraftError, ValueError):
    """A config field is wrong: the message names the field and how to fix it."""


class GraftDataError(GraftError, ValueError):
    """A data sample is wrong: the message names the file/sample index and the problem."""


class RequestError(GraftError, ValueError):
    """One request cannot be served as sent. `param` names the request field, `code` is a
    stable reason for programs, `reason` says what kind of refusal it is; the serving HTTP
    layer maps reasons to status codes (graft.serving.http.openai.openai_chat.APIError.from_request)."""

    REASONS = ("invalid", "forbidden", "too_large", "overloaded", "unavailable")

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 reason: str = "invalid"):
        if reason not in self.REASONS:
            raise ValueError(f"reason {reason!r}: use one of {', '.join(self.REASONS)}")
        super().__init__(message)
        self.message, self.param, self.code, self.reason = message, param, code, reason


def check_fields(cls, d, section: str) -> dict:
    """Return `d` as a dict if it only names fields of dataclass `cls`, else explain.

    Shared by every config block (encoder, adapter, spec sections) so they all reject
    typos the same way: naming the section, the unknown keys and the allowed ones.
    """
    from dataclasses import fields

    if not isinstance(d, dict):
        raise GraftConfigError(f"{section} must be a mapping of fields, got {type(d).__name__}")
    import difflib

    allowed = [f.name for f in fields(cls)]
    unknown = sorted(set(d) - set(allowed), key=str)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
        hint = f"did you mean {section}.{close[0]}? " if close else ""
        raise GraftConfigError(
            f"unknown {section} field(s) {', '.join(map(repr, unknown))} "
            f"({', '.join(f'{section}.{k}' for k in unknown)}); {hint}"
            f"allowed: {', '.join(allowed)}")
    return dict(d)
