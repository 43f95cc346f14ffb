"""Container image references, read the way Docker reads them: the one rule both sides use.

``[registry[:port]/]path[:tag][@sha256:<64 hex>]``. The first path component is the registry when it has a
dot or a colon, or is ``localhost``; otherwise the image is on Docker Hub (``docker.io``), and a one-component
path there is an official image under ``library/``. No tag and no digest means ``latest``.

The control plane checks a booking's ``container.image`` with ``parse`` (a typo is a 400 naming the field), looks
up the project's credentials by ``ImageRef.registry``, and the agent pulls by the same reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
# Where Docker Hub's registry API answers: docker.io is only its name in references.
DOCKER_HUB_API = "registry-1.docker.io"
MAX_NAME = 255

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_HOST = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?))*"
    r"(?::[0-9]{1,5})?$|^\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}$")


class ImageRefError(ValueError):
    """The reference is not one Docker would accept; the message says what is wrong, in words."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port] as written, docker.io for Docker Hub
    repository: str  # the path within the registry (library/ added for official images)
    tag: str | None
    digest: str | None

    @property
    def reference(self) -> str:
        """The tag or digest to ask the registry for (a digest wins when both are given, as Docker does)."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        """Where the registry's HTTP API answers."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def name(self) -> str:
        """``registry/repository``, fully qualified."""
        return f"{self.registry}/{self.repository}"

    @property
    def canonical(self) -> str:
        """The fully qualified reference: ``registry/repository[:tag][@digest]`` (``:latest`` when neither)."""
        text = self.name
        if self.tag or not self.digest:
            text += f":{self.tag or 'latest'}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def with_registry(self, registry: str) -> ImageRef:
        """The same image on another registry (a pull-through mirror keeps the repository path)."""
        return ImageRef(registry=registry, repository=self.repository, tag=self.tag, digest=self.digest)


def parse(text: str) -> ImageRef:
    """Read an image reference, or raise ``ImageRefError`` saying what is wrong with it."""
    if not isinstance(text, str) or not text:
        raise ImageRefError("an image reference is required")
    if text != text.strip() or any(ch.isspace() for ch in text):
        raise ImageRefError("an image reference has no spaces")
    rest = text
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise ImageRefError(f"{digest!r} is not a digest: write @sha256: followed by 64 lowercase hex digits")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.match(tag):
            raise ImageRefError(
                f"{tag!r} is not a tag: up to 128 letters, digits, '_', '.' and '-', not starting with '.' or '-'"
            )
    if not rest:
        raise ImageRefError("the image reference names no repository")
    parts = rest.split("/")
    registry = DOCKER_HUB
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        if not _HOST.match(first):
            raise ImageRefError(f"{first!r} is not a registry host: write host or host:port")
        registry = first
        parts = parts[1:]
    if registry in {"index.docker.io", "registry-1.docker.io"}:
        registry = DOCKER_HUB
    for part in parts:
        if not _COMPONENT.match(part):
            raise ImageRefError(
                f"{part!r} is not a repository name component: lowercase letters and digits, "
                "separated by '.', '_', '__' or '-'"
            )
    if registry == DOCKER_HUB and len(parts) == 1:
        parts = ["library", *parts]
    repository = "/".join(parts)
    if len(f"{registry}/{repository}") > MAX_NAME:
        raise ImageRefError(f"the repository name is longer than {MAX_NAME} characters")
    return ImageRef(registry=registry, repository=repository, tag=tag, digest=digest)


def problem(text: str) -> str | None:
    """What is wrong with ``text`` as an image reference, in words, or None when it is one."""
    try:
        parse(text)
    except ImageRefError as exc:
        return str(exc)
    return None
