"""Requests the server never answered, as their capture records say (docs/capture-format.md): the client
left first (`client_disconnected`), the proxy answered a 502 itself (`upstream_error`), or the server refused
the request with an error status and no counts (a prompt over the context, a shape it cannot read). What a
record shows decides what the report says of the turn and whether llama-server's policy model plays it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from tokendiff.core.plain import plain

WHOLE_REQUEST_UNSENT = "client disconnected before sending the whole request"  # the proxy's words (backends/proxy)
UPSTREAM_CUT = "upstream failed mid-response"  # and the proxy's, before the exception, for an answer cut upstream
PROXY_STOPPED_CUT = "the proxy stopped mid-response"  # for one its shutdown cut


class Unanswered(StrEnum):
    """How a request went without a whole answer."""

    # no answer from the upstream: the proxy answered 502 in its place (the upstream unreachable or failing, or the
    # proxy stopping), or the upstream never had the whole request: nothing the server did is known of it
    NOT_RUN = "not_run"
    # the server answered an error status without counts (`exceed_context_size_error`, a 400 for an input it cannot
    # read, a 503 while loading): it ran nothing, and its slot holds what it held
    REFUSED = "refused"
    CLIENT_LEFT = "client_left"  # sent, and the client left before the upstream answered: it may have run it
    CUT = "cut"  # the upstream answered; the answer did not end (the client left, the upstream or the proxy cut it)


@plain(frozen=True)
class NotAnswered:
    """A request not answered in whole: how, and the record's own words for it. (`@plain`: a dataclass here made
    every report import `dataclasses` and compile its methods, ~5 M instructions.)"""

    kind: Unanswered
    reason: str = ""

    @property
    def ran(self) -> bool:
        """Whether llama-server's policy model plays it: the server had it, or may have."""
        return self.kind not in (Unanswered.NOT_RUN, Unanswered.REFUSED)

    @property
    def note(self) -> str:
        """The turn's note: only what the record shows, and what the report made of it."""
        return unanswered_note(self.kind, self.reason)


def unanswered(
    response: Mapping[str, Any] | None, client_disconnected: bool | None, upstream_error: str | None
) -> NotAnswered | None:
    """What the record shows of a request not answered in whole; None for one answered (an error status
    with the server's counts is an answer: it ran the prompt)."""
    resp: Mapping[str, Any] = response if isinstance(response, Mapping) else {}
    ran = "timings" in resp or "usage" in resp
    if upstream_error and not ran:
        return NotAnswered(Unanswered.NOT_RUN, upstream_error)
    status = resp.get("status")
    if isinstance(status, int) and not isinstance(status, bool) and status >= 400 and not ran:
        return NotAnswered(Unanswered.REFUSED, refusal(status, resp.get("error")))
    error = resp.get("error")
    if (
        resp.get("status") is not None
        and isinstance(error, str)
        and error.startswith((UPSTREAM_CUT, PROXY_STOPPED_CUT))
    ):
        return NotAnswered(Unanswered.CUT, error)  # the upstream's answer cut before its end, the client still there
    if not client_disconnected:
        return None
    if resp.get("status") is not None:
        return NotAnswered(Unanswered.CUT)
    if resp.get("error") == WHOLE_REQUEST_UNSENT:
        return NotAnswered(Unanswered.NOT_RUN, WHOLE_REQUEST_UNSENT)
    return NotAnswered(Unanswered.CLIENT_LEFT)


MAX_REFUSAL = 160  # characters of the server's error message a note keeps (an upstream may send megabytes)


def refusal(status: int, error: object) -> str:
    """'400 exceed_context_size_error: request (43975 tokens) exceeds …': the status and the server's own words
    (an OpenAI- or Anthropic-shaped error object, or the body's text), cut to one short line."""
    words = ""
    if isinstance(error, Mapping):
        words = ": ".join(x for x in (error.get("type"), error.get("message")) if isinstance(x, str) and x)
    elif isinstance(error, str):
        words = error
    words = " ".join(words.split())
    if len(words) > MAX_REFUSAL:
        words = words[: MAX_REFUSAL - 1] + "…"
    return f"{status} {words}".rstrip()


def unanswered_note(kind: Unanswered, reason: str) -> str:
    """The note for `kind`; `reason` the record's words for a request never run."""
    if kind == Unanswered.NOT_RUN:
        why = reason or "the upstream never answered"
        return f"not answered: {why}; the server gave no answer (left out of the totals and the engine model)"
    if kind == Unanswered.REFUSED:
        return f"refused: the server ran nothing, it answered {reason} (left out of the totals and the engine model)"
    if kind == Unanswered.CLIENT_LEFT:
        return (
            "not answered: the client disconnected before the upstream answered; the server may have started it "
            "(the engine model plays it as run, its reply unknown)"
        )
    return f"the answer did not end: {reason}" if reason else "the client disconnected before the answer ended"


__all__ = [
    "NotAnswered",
    "PROXY_STOPPED_CUT",
    "UPSTREAM_CUT",
    "Unanswered",
    "WHOLE_REQUEST_UNSENT",
    "refusal",
    "unanswered",
    "unanswered_note",
]
