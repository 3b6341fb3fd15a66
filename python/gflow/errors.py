"""gflow's typed errors in Python, mirroring include/gflow/error.hpp.

Every error gflow raises, from C++ or from the Python front end, is a gflow.errors.Error with
  .kind     "invalid argument", "usage error", "rank mismatch", "transport error", "timeout", "parse error"
  .subject  the parameter or operation it concerns ("composition", "ready", "policies", ...)
  .fix      what to change (the text after "Fix: " in the message)
and the message "gflow: <kind> in '<subject>': <what happened> Fix: <what to do>".
"""
import builtins


class Error(RuntimeError):
    """gflow::error: every gflow error derives from it."""

    def __init__(self, message, kind="error", subject="", fix=""):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.subject = subject
        self.fix = fix


class InvalidArgument(Error, ValueError):
    """gflow::invalid_argument: a value passed in is outside its allowed range."""


class UsageError(Error):
    """gflow::usage_error: a call made in the wrong state."""


class MismatchError(Error):
    """gflow::mismatch_error: ranks (or a rank and its checkpoint) disagree."""


class TransportError(Error):
    """gflow::transport_error: MPI (or another transport) failed."""


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (mirrors gflow::timeout_error)
    """gflow::timeout_error: a blocking wait ran past its deadline."""


class ParseError(Error):
    """gflow::parse_error: a checkpoint or message could not be read."""


_KIND = {InvalidArgument: "invalid argument", UsageError: "usage error", MismatchError: "rank mismatch",
         TransportError: "transport error", TimeoutError: "timeout", ParseError: "parse error"}


def make(cls, subject, what, fix):
    """An error of class `cls` composed as gflow::error composes its message."""
    kind = _KIND.get(cls, "error")
    message = "gflow: %s in '%s': %s" % (kind, subject, what)
    if fix:
        message += " Fix: " + fix
    return cls(message, kind, subject, fix)
