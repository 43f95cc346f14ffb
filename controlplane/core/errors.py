"""Domain errors raised by services; the API maps each to one clear 4xx response."""

from __future__ import annotations


class DomainError(Exception):
    """A refusal a person can act on. ``code`` is stable for automation; ``message`` is a sentence."""

    status_code = 400
    code = "invalid"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        fields: dict[str, list[str]] | None = None,
        extra: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        self.fields = fields or {}
        self.extra = extra or {}


class ValidationFailed(DomainError):
    status_code = 400
    code = "validation_error"


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class PermissionDenied(DomainError):
    status_code = 403
    code = "permission_denied"


class Conflict(DomainError):
    """Another writer won, or the state does not allow the change (double booking, stale state)."""

    status_code = 409
    code = "conflict"


class QuotaExceeded(DomainError):
    status_code = 409
    code = "quota_exceeded"
