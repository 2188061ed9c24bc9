"""The environment of every process Kilolock starts: Terraform (a real binary or the embedded
``kl-terraform``), its providers and provisioners, and git.

Owns the one rule for what a child may see. Two audiences:

- **A worker** (the GitHub bot) runs other people's Terraform: the child gets an allowlist only — the
  process basics (:data:`BASICS`: ``PATH``, ``HOME``, ``TMPDIR``, the locale, proxies and CA bundles),
  the Terraform plumbing Kilolock needs (:data:`TERRAFORM_PLUMBING`), and the provider variables the
  operator names in ``env:`` of ``.kilolock.yml`` on the default branch (exact names, or a prefix ending
  in ``*``). Nothing else of the worker's environment, so never its ``KL_*`` secrets.
- **A person at kl** keeps their own environment (their provider credentials are theirs to use), minus
  every ``KL_*`` variable and Terraform's ``TF_HTTP_*`` backend settings: the workspace's backend is
  local, and no Terraform run needs Kilolock's own token or database.

Git gets the basics plus ``GIT_*`` and ``SSH_AUTH_SOCK``. Must not: read ``os.environ`` itself (callers
hand the environment in), or add values of its own beyond those rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

BASICS = frozenset({
    "PATH", "HOME", "TMPDIR", "TMP", "TEMP", "USER", "LOGNAME", "TZ", "LANG", "LANGUAGE",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
    "no_proxy",
})
BASIC_PREFIXES = ("LC_",)
TERRAFORM_PLUMBING = frozenset({
    "TF_CLI_CONFIG_FILE", "TF_PLUGIN_CACHE_DIR", "TF_PLUGIN_CACHE_MAY_BREAK_DEPENDENCY_LOCK_FILE", "TF_IN_AUTOMATION",
    "TF_INPUT", "CHECKPOINT_DISABLE", "TF_LOG", "TF_LOG_CORE", "TF_LOG_PROVIDER", "TF_REGISTRY_DISCOVERY_RETRY",
    "TF_REGISTRY_CLIENT_TIMEOUT",
})
GIT_PREFIXES = ("GIT_",)
GIT_NAMES = frozenset({"SSH_AUTH_SOCK"})
# Never passed to any child, whatever an allowlist says: Kilolock's own settings and secrets, and the
# HTTP backend's settings (a workspace's backend is local).
FORBIDDEN_PREFIXES = ("KL_", "TF_HTTP_")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")


def is_forbidden(name: str) -> bool:
    return name.upper().startswith(FORBIDDEN_PREFIXES)


def passthrough_problem(name: str) -> str | None:
    """Why ``name`` cannot be an ``env:`` passthrough entry (None when it can)."""
    if isinstance(name, str) and name.endswith("*") and len(name.rstrip("*")) < 2:
        return f"{name!r} would pass the whole environment: name the provider's variables"
    if not isinstance(name, str) or not _NAME.match(name):
        return (f"{name!r} is not a variable name: use letters, digits and '_', optionally ending in '*' for a "
                "prefix (AWS_*)")
    head = name.rstrip("*").upper()
    if is_forbidden(head) or any(f.startswith(head) for f in FORBIDDEN_PREFIXES):
        return f"{name!r} names Kilolock's own settings, which never reach Terraform"
    return None


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)


def for_worker(source: Mapping[str, str], passthrough: Iterable[str]) -> dict[str, str]:
    """A worker's Terraform environment: the basics, the plumbing and the ``passthrough`` names, no more."""
    wanted = tuple(passthrough)
    return {k: v for k, v in source.items() if not is_forbidden(k) and (
        k in BASICS or k.startswith(BASIC_PREFIXES) or k in TERRAFORM_PLUMBING or _matches(k, wanted))}


def for_person(source: Mapping[str, str]) -> dict[str, str]:
    """``kl``'s Terraform environment: the user's own, without ``KL_*`` and ``TF_HTTP_*``."""
    return {k: v for k, v in source.items() if not is_forbidden(k)}


def for_git(source: Mapping[str, str]) -> dict[str, str]:
    """git's environment: the basics, ``GIT_*`` and the SSH agent."""
    return {k: v for k, v in source.items() if not is_forbidden(k) and (
        k in BASICS or k.startswith(BASIC_PREFIXES + GIT_PREFIXES) or k in GIT_NAMES)}
