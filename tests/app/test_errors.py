"""Every KlError carries its HTTP status and a stable code: the class name unless the class names another."""

from __future__ import annotations

import app.errors as errors
from app.embedded import EmbeddedServiceError
from app.web.exposure import OpenModeNetworkError
from app.web.webhook import SignatureInvalidError, SignatureMissingError, WebhookSecretUnsetError


def test_the_code_is_the_class_name_in_snake_case_unless_the_class_sets_one():
    assert errors.StateLockedError.code == "state_locked"
    assert errors.WriteOutsideReservationError.code == "write_outside_reservation"
    assert errors.ServiceUnavailableError.code == "unavailable"
    assert errors.TicketExpiredError.code == "wait_ticket_expired"
    assert errors.KlError.code == "internal" and errors.ConfigError.code == "config"
    assert [e.code for e in (SignatureMissingError, SignatureInvalidError, WebhookSecretUnsetError,
                             OpenModeNetworkError, EmbeddedServiceError)] == [
        "signature_missing", "signature_invalid", "webhook_secret_unset", "open_mode_network", "embedded_service"]


def test_statuses_are_inherited_from_the_family_and_waits_carry_retry_after():
    assert errors.AuthThrottledError.status == 429 and errors.RunNotFoundError.status == 404
    assert errors.BodyCapacityError.status == 503
    assert issubclass(errors.BodyCapacityError, errors.ServiceUnavailableError)
    waited = errors.BodyCapacityError("busy", retry_after=5)
    assert waited.retry_after == 5 and waited.data == {"retry_after": 5}
    assert errors.DatabaseUnavailableError.status == 503


def test_every_code_in_the_tree_is_distinct():
    seen: dict[str, type] = {}

    def walk(cls: type[errors.KlError]) -> None:
        for sub in cls.__subclasses__():
            assert seen.setdefault(sub.code, sub) is sub, f"{sub.__name__} and {seen[sub.code].__name__}: {sub.code}"
            walk(sub)

    walk(errors.KlError)
