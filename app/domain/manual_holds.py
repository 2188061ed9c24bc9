"""Manual holds: write reservations an operator takes by hand (a change freeze, out-of-band work), with a
reason and an owner, released by ``kl release`` or by expiry.

A hold is an apply run of its own (as a pull-request hold is): its id is the run's id, its reservations are
write reservations, its run's info carries ``{"manual_hold": …}``. Its reservations' holder text names the
owner, the reason and the release command, so every path that meets it (``kl``'s refusal and wait messages,
Terraform's LOCK 423 LockInfo, the bot's conflict comments, ``kl reservations``, the dashboard) says who holds
it, why, and how to end it.

Must not: touch the database (app.store.manual_holds does).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import timedelta

from app.errors import BadRequestError, HoldForbiddenError

MAX_REASON = 200
MAX_HOLDER = 100
DEFAULT_HOLD_SECONDS = 4 * 3600
MAX_HOLD_SECONDS = 7 * 24 * 3600
# The shortest hold: shorter ones are a run's lease, not a freeze.
MIN_HOLD_SECONDS = 60
DEFAULT_MAX_HOLDS_PER_TOKEN = 10
DEFAULT_MAX_HOLDS_PER_STATE = 20
# A hold without expiry still has a lease (a run's lease column is finite): decades, as a pull-request hold's.
UNTIL_RELEASED = timedelta(days=365 * 60)


@dataclass(frozen=True, slots=True)
class HoldPolicy:
    """The operator's bounds on manual holds (KL_HOLD_* settings)."""

    default_seconds: int = DEFAULT_HOLD_SECONDS
    max_seconds: int = MAX_HOLD_SECONDS
    max_per_token: int = DEFAULT_MAX_HOLDS_PER_TOKEN
    max_per_state: int = DEFAULT_MAX_HOLDS_PER_STATE
    # Token names that may hold until released; "*" lets every caller.
    until_released: tuple[str, ...] = ()

    def may_hold_until_released(self, token_name: str, actor: str) -> bool:
        return "*" in self.until_released or bool(token_name) and token_name in self.until_released

    def lease(self, *, until_seconds: float | None, until_released: bool, token_name: str,
              actor: str) -> timedelta | None:
        """The hold's lease; None for a hold until released. Raises BadRequestError for a duration out of
        bounds and ForbiddenError for an until-released hold the caller may not take."""
        if until_released:
            if until_seconds is not None:
                raise BadRequestError("give either until_seconds or until_released, not both")
            if not self.may_hold_until_released(token_name, actor):
                raise HoldForbiddenError(
                    "this token may not take a hold without expiry: give --until DURATION (at most "
                    f"{self.max_seconds} s), or ask the operator to list the token in KL_HOLD_UNTIL_RELEASED")
            return None
        if until_seconds is None:
            return timedelta(seconds=min(self.default_seconds, self.max_seconds))
        if not MIN_HOLD_SECONDS <= until_seconds <= self.max_seconds:
            raise BadRequestError(f"until_seconds must be between {MIN_HOLD_SECONDS} and {self.max_seconds} "
                                  "(KL_HOLD_MAX_SECONDS)")
        return timedelta(seconds=until_seconds)


def check_reason(value: object) -> str:
    """The hold's reason: one line of printable text, 1 to MAX_REASON characters (it is shown to everyone
    that meets the hold: never put secrets in it)."""
    if not isinstance(value, str) or not value.strip():
        raise BadRequestError("reason is required: say why the addresses are held (e.g. --reason 'change freeze')")
    text = " ".join(value.split())
    if len(text) > MAX_REASON:
        raise BadRequestError(f"reason must be at most {MAX_REASON} characters, not {len(text)}")
    if any(unicodedata.category(ch).startswith("C") for ch in text):
        raise BadRequestError("reason must be printable text without control characters")
    return text


def holder_text(owner: str, reason: str, hold_id: str) -> str:
    """The holder every conflict names: ``alice's manual hold "change freeze" (release: kl release ar_…)``."""
    return f'{owner[:MAX_HOLDER]}\'s manual hold "{reason}" (release: kl release {hold_id})'


_HOLDER = re.compile(r'.*\'s manual hold ".*" \(release: kl release ar_[0-9a-f]+\)', re.DOTALL)


def is_manual_holder(holder: str) -> bool:
    """Whether a reservation's holder text is a manual hold's (:func:`holder_text`)."""
    return _HOLDER.fullmatch(holder) is not None
