"""Typed exceptions. Each keeps the server's message as its text."""

from __future__ import annotations

from valkey.exceptions import ResponseError


class RateLimitError(Exception):
    """Base class of every error raised by this package."""


class CommandError(RateLimitError, ValueError):
    """The server refused the call's arguments (``ERR ...``): a bug in the caller."""


class WrongTypeError(RateLimitError):
    """The key holds another kind of value, or another algorithm's limiter (``WRONGTYPE ...``)."""


class PolicyNotFoundError(RateLimitError, LookupError):
    """``RL.LIMIT`` or ``RL.ALL`` named a policy the node does not have."""


class TryAgainError(RateLimitError):
    """A waiting call's key vanished (cluster migration): send it again (``TRYAGAIN ...``)."""


class UnavailableError(RateLimitError, ConnectionError):
    """The server could not be reached or did not answer in time (failure policy ``"raise"``)."""


class LeaseNotGrantedError(RateLimitError):
    """``hold()`` did not get its lease (denied, or the BLOCK wait ended without one)."""


def from_response(exc: ResponseError) -> RateLimitError:
    """The typed exception for a server error reply, with the server's message."""
    message = str(exc)
    if message.startswith("WRONGTYPE"):
        return WrongTypeError(message)
    if message.startswith("TRYAGAIN"):
        return TryAgainError(message)
    if "no policy named" in message:
        return PolicyNotFoundError(message)
    return CommandError(message)
