"""What can go wrong, and the exit code each failure gives (listed in ``gpucp --help`` and docs/access.md)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Exit(IntEnum):
    OK = 0
    REFUSED = 1  # the API refused the request (a 4xx other than those below)
    USAGE = 2  # bad usage: click's own code for a wrong option or argument
    AUTH = 3  # not logged in, the credentials were refused (401), or the role does not allow it (403)
    NOT_FOUND = 4  # no such object among yours (404)
    SERVER = 5  # the server failed (5xx), or could not be reached or understood


EXIT_CODES_HELP = """\b
Exit codes:
  0  done
  1  the API refused the request (4xx: invalid, conflict, over quota, no capacity)
  2  bad usage (a wrong option or argument)
  3  not logged in, credentials refused (401), or not allowed for your role (403)
  4  not found (404): no such object among yours
  5  server error (5xx), or the server could not be reached"""

# Codes the API answers with a 400 that are about who is calling, not about the request.
_AUTH_CODES = frozenset({"invalid_credentials"})


def exit_for(status: int, code: str = "") -> Exit:
    """The one mapping from an HTTP answer to an exit code."""
    if status in (401, 403) or code in _AUTH_CODES:
        return Exit.AUTH
    if status == 404:
        return Exit.NOT_FOUND
    if 400 <= status < 500:
        return Exit.REFUSED
    return Exit.SERVER


class GpucpError(Exception):
    """A failure to report: ``body`` is in the API's error shape, printed as it is under ``--json``."""

    def __init__(self, message: str, *, exit_code: Exit, code: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.code = code
        self.body = body or {"error": {"code": code, "message": message, "fields": {}}}


class ApiError(GpucpError):
    """The API answered with an error: its own ``{"error": {"code", "message", "fields"}}``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        error = body["error"]
        code = str(error.get("code") or "error")
        super().__init__(
            str(error.get("message") or f"HTTP {status}"), exit_code=exit_for(status, code), code=code, body=body
        )
        self.status = status
        self.fields: dict[str, list[str]] = dict(error.get("fields") or {})


class NotLoggedIn(GpucpError):
    def __init__(self, message: str = "Not logged in: run `gpucp login` (or set GPUCP_TOKEN).") -> None:
        super().__init__(message, exit_code=Exit.AUTH, code="not_logged_in")


class Unreachable(GpucpError):
    """No answer the CLI can use: the server is down, the network failed, or the answer was not the API's."""

    def __init__(self, message: str, code: str = "unreachable") -> None:
        super().__init__(message, exit_code=Exit.SERVER, code=code)


class ConfigError(GpucpError):
    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=Exit.USAGE, code="bad_config")
