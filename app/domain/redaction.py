"""The one redaction rule for text that leaves Kilolock's hands: comments, check runs, commit statuses and
issues on GitHub, and the worker's logs.

Three things are replaced by :data:`HIDDEN`:

- **token shapes**: GitHub tokens (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), Kilolock
  tokens (``kl_``, ``klbot_``), PEM private keys, AWS access key ids and ``aws_secret_access_key = …``, bearer
  and basic credentials, and the password of a URL (``postgresql://user:PASSWORD@host``);
- **known secrets**: the exact values the process was configured with (``Redactor.secrets``: the ``KL_*``
  secrets, an installation token, the provider variables handed to Terraform);
- **values in Terraform's diagnostics**: the lines of an expression's values (``var.api_key is "…"``,
  ``local.x is …``) keep the reference and lose the value.

Pure: text in, text out. Must not: escape Markdown (``runner.bot.markdown`` does that, after redaction).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

HIDDEN = "[redacted]"
# Shorter configured values are not hidden: they would blank out ordinary words.
MIN_SECRET_LENGTH = 8

_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)", re.S)
_TOKENS = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,}|klbot_[A-Za-z0-9_\-]{6,}"
    r"|kl_[A-Za-z0-9_\-]{20,}|(?:AKIA|ASIA)[0-9A-Z]{16})"
)
_ASSIGNED = re.compile(r"(?i)\b(aws_secret_access_key|aws_session_token|password|passwd|secret|api[_-]?key)"
                       r"(\s*[=:]\s*)(\"[^\"\n]*\"|'[^'\n]*'|[^\s,;]+)")
_AUTH = re.compile(r"(?i)\b(bearer|basic|token)(\s+)([A-Za-z0-9._~+/=\-]{12,})")
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/@]*:)([^\s@/]+)(@)")
# A value line of Terraform's diagnostics, "│ var.api_key is "…"" (the box drawing is optional: the
# compact and plain renderings lose it).
_REFERENCE = r"(?:var|local|each|count|module|data|self|path|terraform)(?:\.[\w\-]+|\[[^\]\n]*\])+"
_VALUE_LINE = re.compile(rf"(?m)^([ \t│|├└─]*)({_REFERENCE}|[A-Za-z_][\w\-]*\.[\w\-]+(?:\.[\w\-]+|\[[^\]\n]*\])*)"
                         r" is (?!a sensitive value)(.+)$")


@dataclass(frozen=True, slots=True)
class Redactor:
    """Redaction with a set of known secret values (exact matches, longest first)."""

    secrets: tuple[str, ...] = ()

    @classmethod
    def of(cls, values: Iterable[str | None]) -> Redactor:
        kept = {v.strip() for v in values if v and len(v.strip()) >= MIN_SECRET_LENGTH}
        return cls(tuple(sorted(kept, key=len, reverse=True)))

    def with_secrets(self, values: Iterable[str | None]) -> Redactor:
        return Redactor.of((*self.secrets, *values))

    def redact(self, text: str) -> str:
        return redact(text, self.secrets)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with token shapes, the given secret values and Terraform's diagnostic values hidden."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, HIDDEN)
    text = _PEM.sub(HIDDEN, text)
    text = _TOKENS.sub(HIDDEN, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + HIDDEN + m.group(3), text)
    text = _ASSIGNED.sub(lambda m: m.group(1) + m.group(2) + HIDDEN, text)
    text = _AUTH.sub(lambda m: m.group(1) + m.group(2) + HIDDEN, text)
    return _VALUE_LINE.sub(_hide_value, text)


def _hide_value(match: re.Match[str]) -> str:
    lead, reference = match.group(1), match.group(2)
    if not lead.strip() and not reference.startswith(_REFERENCE_HEADS):
        return match.group(0)  # prose such as "main.tf is invalid": only box-drawn lines quote values
    return f"{lead}{reference} is {HIDDEN}"


_REFERENCE_HEADS = ("var.", "local.", "each.", "count.", "module.", "data.", "self.", "path.", "terraform.")


def redact_logs(redactor: Redactor) -> None:
    """Make every log record of this process pass :func:`redact` when it is created, message and traceback
    alike, whichever logger or handler (RQ installs its own) writes it. Idempotent per process."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "kilolock_redaction", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        record.msg, record.args = redactor.redact(record.getMessage()), ()
        if record.exc_info:
            record.exc_text = redactor.redact(logging.Formatter().formatException(record.exc_info))
        return record

    factory.kilolock_redaction = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)
