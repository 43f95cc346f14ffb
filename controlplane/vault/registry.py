"""The image check at booking (docs/images.md, "The check at booking").

Syntax by ``nodeagent.imageref`` (the agent's own rule) and the operators' allow-list, always; then, where
``IMAGES_CHECK_AT_BOOKING`` is "verify", a manifest request to the registry (OCI distribution API) with the
project's credential for it: Basic auth, or the Bearer token a 401's ``WWW-Authenticate`` points to.

- found: the booking goes on (remembered ``IMAGES_CHECK_FOUND_TTL_S`` per project, image and credential);
- not found: a 400 naming ``container.image``, with the registry's words;
- unauthorized: a 400 saying the project has no (valid) credentials for that registry;
- no answer (refused, timeout, DNS, a 5xx): the booking is accepted with a warning, and the registry is
  remembered as unreachable for ``IMAGES_CHECK_UNREACHABLE_TTL_S`` so that a burst of bookings does not wait
  on it each time. A booking never spends more than ``IMAGES_CHECK_TIMEOUT_S`` here.

Nothing here logs or raises a password or a token: requests are made with ``auth=``, never a URL holding them.
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings

from controlplane.core.errors import ValidationFailed
from controlplane.vault.models import EntryKind, VaultEntry
from nodeagent import imageref

FIELD = "container.image"
ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
USER_AGENT = "gpucp-controlplane (image check)"
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


def allowed_problem(ref: imageref.ImageRef) -> str | None:
    """Why the operators' allow-list (``IMAGES_ALLOWED_REGISTRIES``) refuses ``ref``'s registry, or None."""
    allowed = [r.strip().lower() for r in getattr(settings, "IMAGES_ALLOWED_REGISTRIES", []) or [] if r.strip()]
    if not allowed or ref.registry.lower() in allowed:
        return None
    return f"Images from {ref.registry} are not allowed here; the allowed registries are {', '.join(allowed)}."


def image_problem(image: str) -> str | None:
    """What is wrong with ``image`` as a booking's image, without the network: its syntax, then the allow-list."""
    try:
        ref = imageref.parse(image)
    except imageref.ImageRefError as exc:
        return f"Not an image reference: {exc}."
    return allowed_problem(ref)


# -- memory of recent answers (per process) -----------------------------------------------------------------
_lock = threading.Lock()
_unreachable: dict[str, float] = {}  # api host -> monotonic time until which it is not asked
_found: dict[tuple[int, str, str], float] = {}  # (project id, canonical, credential stamp) -> until


def forget() -> None:
    """Drop what is remembered (tests; an operator's change of registry)."""
    with _lock:
        _unreachable.clear()
        _found.clear()


def _remembered(table: dict[Any, float], key: Any) -> bool:
    with _lock:
        until = table.get(key)
        if until is None:
            return False
        if until < time.monotonic():
            del table[key]
            return False
        return True


def _remember(table: dict[Any, float], key: Any, ttl: float) -> None:
    if ttl <= 0:
        return
    with _lock:
        if len(table) > 10000:
            table.clear()
        table[key] = time.monotonic() + ttl


# -- the manifest request ------------------------------------------------------------------------------------


class _Unreachable(Exception):
    pass


@dataclass(frozen=True)
class _Answer:
    status: int
    words: str


def _scheme(host: str) -> str:
    """https, except on loopback, where the engine too pulls over plain HTTP without configuration."""
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host[1 : host.index("]")]
    if name == "localhost":
        return "http"
    try:
        return "http" if ipaddress.ip_address(name).is_loopback else "https"
    except ValueError:
        return "https"


def _words(response: requests.Response) -> str:
    """The registry's own words from an error body (``{"errors": [{"code", "message"}]}``), else its reason."""
    try:
        body = response.json()
        errors = body.get("errors") if isinstance(body, dict) else None
        parts = [f"{e.get('code', '')} {e.get('message', '')}".strip() for e in errors or [] if isinstance(e, dict)]
        text = "; ".join(p for p in parts if p)
    except ValueError:
        text = ""
    return (text or f"{response.status_code} {response.reason or ''}".strip())[:300]


class _Session:
    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.http = requests.Session()
        self.http.trust_env = False  # no proxy or .netrc from the environment: the project's credential only

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        left = self.deadline - time.monotonic()
        if left <= 0.05:
            raise _Unreachable("the check ran out of time")
        try:
            return self.http.request(
                method,
                url,
                timeout=(min(left, 2.0), left),
                allow_redirects=True,
                headers={"User-Agent": USER_AGENT, **kwargs.pop("headers", {})},
                **kwargs,
            )
        except requests.RequestException as exc:
            raise _Unreachable(type(exc).__name__) from None


def _bearer_token(session: _Session, challenge: str, scope: str, auth: tuple[str, str] | None) -> str | None:
    params = dict(_CHALLENGE_PARAM.findall(challenge))
    realm = params.pop("realm", None)
    if not realm or not realm.startswith(("https://", "http://")):
        return None
    query = {"service": params["service"]} if "service" in params else {}
    query["scope"] = params.get("scope", scope)
    response = session.request("GET", realm, params=query, auth=auth)
    if response.status_code in (401, 403):
        return None
    if response.status_code >= 400:
        raise _Unreachable(f"token service answered {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        return None
    token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    return token if isinstance(token, str) and token else None


def _manifest(ref: imageref.ImageRef, auth: tuple[str, str] | None, deadline: float) -> _Answer:
    session = _Session(deadline)
    url = f"{_scheme(ref.api_host)}://{ref.api_host}/v2/{ref.repository}/manifests/{ref.reference}"
    headers = {"Accept": ACCEPT}
    response = session.request("HEAD", url, headers=headers)
    if response.status_code == 401:
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        if scheme == "bearer":
            token = _bearer_token(session, challenge, f"repository:{ref.repository}:pull", auth)
            if token is not None:
                response = session.request("HEAD", url, headers={**headers, "Authorization": f"Bearer {token}"})
                headers["Authorization"] = f"Bearer {token}"
        elif scheme == "basic" and auth is not None:
            response = session.request("HEAD", url, headers=headers, auth=auth)
    if response.status_code == 200:
        return _Answer(200, "")
    if response.status_code >= 500 or response.status_code == 429:
        raise _Unreachable(f"the registry answered {response.status_code}")
    # A HEAD has no body: ask again with GET for the registry's words.
    detail = session.request("GET", url, headers=headers, auth=auth if "Authorization" not in headers else None)
    if detail.status_code == 200:
        return _Answer(200, "")
    return _Answer(response.status_code, _words(detail))


def check_image(*, project: Any, image: str) -> list[dict[str, Any]]:
    """Check a booking's image for ``project``: the warnings to show in the booking's answer, or ValidationFailed
    naming ``container.image``. Syntax and the allow-list always; existence where the setting says "verify"."""
    problem = image_problem(image)
    if problem is not None:
        raise ValidationFailed(f"{FIELD}: {problem}", fields={FIELD: [problem]})
    if getattr(settings, "IMAGES_CHECK_AT_BOOKING", "syntax") != "verify":
        return []
    ref = imageref.parse(image)
    entry = (
        VaultEntry.objects.filter(project=project, kind=EntryKind.REGISTRY, name=ref.registry.lower())
        .only("pk", "name", "username", "sealed", "updated_at")
        .first()
    )
    stamp = "" if entry is None else f"{entry.pk}:{entry.updated_at.isoformat()}"
    found_key = (project.pk, ref.canonical, stamp)
    if _remembered(_found, found_key):
        return []
    if _remembered(_unreachable, ref.api_host):
        return [_not_checked(ref, "it did not answer a moment ago")]
    auth = None
    if entry is not None:
        from controlplane.vault.services import registry_auth_for

        credential = registry_auth_for(project, image)
        auth = None if credential is None else (credential.username, credential.password)
    deadline = time.monotonic() + float(getattr(settings, "IMAGES_CHECK_TIMEOUT_S", 4.0))
    try:
        answer = _manifest(ref, auth, deadline)
    except _Unreachable as exc:
        _remember(_unreachable, ref.api_host, float(getattr(settings, "IMAGES_CHECK_UNREACHABLE_TTL_S", 60.0)))
        return [_not_checked(ref, f"it could not be reached ({exc})")]
    if answer.status == 200:
        _remember(_found, found_key, float(getattr(settings, "IMAGES_CHECK_FOUND_TTL_S", 300.0)))
        return []
    if answer.status in (401, 403):
        if entry is None:
            message = (
                f"{ref.registry} refused to show {ref.canonical} ({answer.words}): the image is private or does not "
                f"exist, and the project has no credentials for {ref.registry}; add them under the project's "
                "registries."
            )
        else:
            message = (
                f"{ref.registry} refused the project's credentials for {ref.registry} (user {entry.username}) "
                f"for {ref.canonical} ({answer.words}): replace them under the project's registries."
            )
        raise ValidationFailed(f"{FIELD}: {message}", fields={FIELD: [message]}, code="image_unauthorized")
    if answer.status == 404:
        message = f"{ref.canonical} was not found on {ref.registry}: {answer.words}."
        raise ValidationFailed(f"{FIELD}: {message}", fields={FIELD: [message]}, code="image_not_found")
    message = f"{ref.registry} did not accept the image {ref.canonical}: {answer.words}."
    raise ValidationFailed(f"{FIELD}: {message}", fields={FIELD: [message]}, code="image_refused")


def _not_checked(ref: imageref.ImageRef, why: str) -> dict[str, Any]:
    return {
        "code": "image_not_checked",
        "message": f"The image {ref.canonical} could not be checked: {why}. The booking stands; the pre-pull on "
        "its servers tells you before the window opens if the image cannot be pulled.",
        "image": ref.canonical,
        "registry": ref.registry,
    }
