"""The public HTTP API (``/api/v1/``), through requests: bearer token or session, the error shape, retries.

Every POST carries an ``Idempotency-Key``. A request that may have reached the server without its answer
coming back (the connection dropped mid-exchange, a read timeout, a 502/503/504 from a proxy, or the API's
409 ``idempotency_request_in_progress``) is sent again with the same key and body, so the server runs it at
most once and the retry gets the first answer. A request that cannot have been sent (connection refused, no
such host, a TLS failure) is not retried: there is nothing to recover, and waiting only delays the error.
"""

from __future__ import annotations

import time
import uuid
from typing import Any
from urllib.parse import quote

import requests
from urllib3.exceptions import ProtocolError

from gpucp import __version__
from gpucp.errors import ApiError, Unreachable

API = "/api/v1"
ATTEMPTS = 3
BACKOFF_S = (0.5, 1.0)
RETRY_STATUSES = frozenset({502, 503, 504})
DEFAULT_TIMEOUT_S = 30.0


def path(*parts: object, slash: bool = True) -> str:
    """An API path from its segments, each quoted, so no argument can step into another endpoint."""
    joined = API + "/" + "/".join(quote(str(p), safe="") for p in parts)
    return joined + "/" if slash else joined


class Api:
    def __init__(self, server: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.server = server.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"gpucp/{__version__}"
        self.session.headers["Accept"] = "application/json"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, url: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", url, params=params)

    def post(self, url: str, body: dict[str, Any] | None = None, *, key: str | None = None) -> Any:
        return self.request("POST", url, body=body if body is not None else {}, key=key or str(uuid.uuid4()))

    def request(
        self, method: str, url: str, *, params: dict[str, Any] | None = None, body: Any = None, key: str | None = None
    ) -> Any:
        headers: dict[str, str] = {}
        if key is not None:
            headers["Idempotency-Key"] = key
        csrf = self.session.cookies.get("csrftoken")
        if method not in ("GET", "HEAD", "OPTIONS") and csrf and "Authorization" not in self.session.headers:
            # A session (login): Django wants the token back in a header, and a Referer from its own origin
            # on HTTPS.
            headers["X-CSRFToken"] = csrf
            headers["Referer"] = self.server + "/"
        for attempt in range(ATTEMPTS):
            last = attempt == ATTEMPTS - 1
            try:
                response = self.session.request(
                    method, self.server + url, params=params, json=body, headers=headers, timeout=self.timeout
                )
            except (requests.ReadTimeout, requests.exceptions.ChunkedEncodingError) as exc:
                if last:
                    raise Unreachable(f"{self.server} did not answer in time ({exc.__class__.__name__}).") from exc
            except requests.ConnectionError as exc:
                if last or not _may_have_arrived(exc):
                    raise Unreachable(f"Cannot reach {self.server}: {_reason(exc)}") from exc
            else:
                if not last and _retry_answer(response):
                    time.sleep(_pause(attempt, response))
                    continue
                return _result(response, self.server)
            time.sleep(BACKOFF_S[attempt])
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def _may_have_arrived(exc: requests.ConnectionError) -> bool:
    """True when the connection broke during the exchange (the server may have acted), not before it."""
    return any(isinstance(arg, ProtocolError) for arg in exc.args)


def _retry_answer(response: requests.Response) -> bool:
    if response.status_code in RETRY_STATUSES:
        return True
    return response.status_code == 409 and _code(response) == "idempotency_request_in_progress"


def _pause(attempt: int, response: requests.Response) -> float:
    retry_after = response.headers.get("Retry-After", "")
    if retry_after.isdigit():
        return min(float(retry_after), 10.0)
    return BACKOFF_S[attempt]


def _code(response: requests.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def _reason(exc: requests.ConnectionError) -> str:
    text = str(exc.args[0] if exc.args else exc)
    # urllib3 wraps the cause in "Max retries exceeded with url: ... (Caused by ...)": keep the cause.
    if "Caused by " in text:
        text = text.split("Caused by ", 1)[1].rstrip(")")
    return text


def _result(response: requests.Response, server: str) -> Any:
    status = response.status_code
    if status < 400 and not response.content:
        return None  # 204: done, nothing to say
    try:
        data = response.json()
    except ValueError:
        data = None
    if status < 400:
        if data is None:
            raise Unreachable(
                f"{server} answered HTTP {status} without JSON: is it the GPU control plane?", code="not_the_api"
            )
        return data
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        raise ApiError(status, data)
    # Not the API's shape: a proxy in front of it, or another site altogether.
    snippet = " ".join(response.text.split())[:200]
    body = {"error": {"code": "http_error", "message": f"HTTP {status} from {server}: {snippet}", "fields": {}}}
    raise ApiError(status, body)


def session_login(api: Api, *, username: str, password: str, token_name: str) -> dict[str, Any]:
    """Log in with a password through the portal's session (CSRF), create a personal token, log out.

    Returns the API's answer for the new token; its ``token`` field is the plaintext, shown this once.
    """
    api.get(path("auth", "csrf"))
    api.post(path("auth", "login"), {"username": username, "password": password})
    # Login rotates the CSRF token: request() reads the cookie again on every call.
    created: dict[str, Any] = api.post(path("tokens"), {"name": token_name})
    try:
        api.post(path("auth", "logout"))
    except (ApiError, Unreachable):
        pass  # the session ends by itself; the token is what matters
    return created


def find_token_id(api: Api, token: str) -> int | None:
    """The id of the caller's own token, by its public prefix (``gcp_<lookup>_``)."""
    parts = token.split("_", 2)
    if len(parts) != 3:
        return None
    prefix = f"{parts[0]}_{parts[1]}_"
    offset, limit = 0, 500
    while True:
        page = api.get(path("tokens"), {"limit": limit, "offset": offset})
        for item in page.get("results", []):
            if item.get("prefix") == prefix:
                return int(item["id"])
        offset += limit
        if offset >= int(page.get("count", 0)):
            return None
