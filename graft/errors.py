"""Exceptions with messages that name the field or sample and the fix.

A leaf module (imports nothing of ours) so every subpackage may raise these.
"""


class GraftError(Exception):
    """Base of every error graft raises on purpose."""


class GraftConfigError(GraftError, ValueError):
    """A config field is wrong: the message names the field and how to fix it."""


class GraftDataError(GraftError, ValueError):
    """A data sample is wrong: the message names the file/sample index and the problem."""
