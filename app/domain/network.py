"""Network addresses as the rules see them: whether a host or a peer is this machine.

Owns: reading a peer or host as servers and proxies write it (``127.0.0.1``, ``[::1]:8080``, ``"::1"``,
``localhost``). Open mode answers only such clients (``app.web.exposure``) and ``kl serve`` refuses to
bind anything else in open mode. Must not: resolve names through DNS or look at requests.
"""

from __future__ import annotations

import ipaddress


def is_loopback(address: str | None) -> bool:
    """True for a loopback host or peer, with or without a port, bracketed or quoted; False for anything else."""
    if not address:
        return False
    host = address.strip().strip('"')
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]  # host:port
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
