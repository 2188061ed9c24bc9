"""Failed-authentication throttling: the pure rules over one key's counter.

A key (``addr:203.0.113.7`` or ``token:tok_…``) counts failures in fixed windows of ``window``
seconds. Once a window holds ``limit`` failures the key is refused (429) until the window ends; the
first failure of each window is audited, carrying the previous window's count, so an attacker
costs the audit trail at most one row per key and window.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Counter:
    """A key's stored counter: when its window started and the failures counted in it."""

    window_started: datetime
    failures: int


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one more failure means: the counter to store, whether to audit, and whether to refuse."""

    counter: Counter
    audit: bool
    previous_failures: int
    blocked: bool
    retry_after: int


def retry_after(counter: Counter | None, now: datetime, *, limit: int, window: int) -> int | None:
    """Seconds until the key may try again, or None when it is not blocked."""
    if counter is None or counter.failures < limit:
        return None
    ends = counter.window_started + timedelta(seconds=window)
    if ends <= now:
        return None
    return max(1, int((ends - now).total_seconds() + 0.999))


def after_failure(counter: Counter | None, now: datetime, *, limit: int, window: int) -> Verdict:
    """Count one failure: a new window when none is open, else one more in the open one."""
    open_window = counter is not None and counter.window_started + timedelta(seconds=window) > now
    if counter is None or not open_window:
        updated = Counter(window_started=now, failures=1)
        previous = 0 if counter is None else counter.failures
        audit = True
    else:
        updated = Counter(window_started=counter.window_started, failures=counter.failures + 1)
        previous = 0
        audit = updated.failures == limit  # once more when the key becomes blocked
    wait = retry_after(updated, now, limit=limit, window=window)
    return Verdict(counter=updated, audit=audit, previous_failures=previous, blocked=wait is not None,
                   retry_after=wait or 0)


def parse_networks(items: Sequence[str]) -> tuple[Network, ...]:
    """``10.0.0.0/8, 192.0.2.1`` → networks; raises ValueError naming a bad entry."""
    found: list[Network] = []
    for item in items:
        try:
            found.append(ipaddress.ip_network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{item.strip()!r} is not an IP address or CIDR network") from None
    return tuple(found)


def _trusted(address: str, proxies: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return False
    return any(ip in net for net in proxies)


def client_address(peer: str, forwarded_for: str | None, proxies: Sequence[Network]) -> str:
    """The address to throttle: the TCP peer, unless the peer is a trusted proxy; then the right-most
    ``X-Forwarded-For`` entry that is not itself a trusted proxy (entries left of it are the client's
    own claims and are ignored). Malformed entries stop the walk at the last trusted hop."""
    if not proxies or not forwarded_for or not _trusted(peer, proxies):
        return peer
    current = peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",")][:32]):
        try:
            ipaddress.ip_address(hop)
        except ValueError:
            return current
        current = hop
        if not _trusted(hop, proxies):
            return hop
    return current
