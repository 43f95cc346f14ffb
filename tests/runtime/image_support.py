"""Images for the pull tests: distinct per test (a layer of random bytes on top of the local test image), pushed to
the test registry under unique names, and every local trace of them removed afterwards."""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from typing import Any

from docker.errors import APIError, ImageNotFound


def sized_image(client: Any, base: str, name: str, size_bytes: int) -> str:
    """Build ``name`` (repository:tag) from ``base`` plus one layer holding ``size_bytes`` of random bytes, without
    running anything (``COPY`` only), so every call makes an image of its own. Returns ``name``."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        dockerfile = f"FROM {base}\nCOPY blob /gpucp-blob\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
        info = tarfile.TarInfo("blob")
        info.size = size_bytes
        tar.addfile(info, _RandomReader(size_bytes))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=name, rm=True, pull=False)
    return name


class _RandomReader(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return os.urandom(n)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def push_distinct(
    client: Any, registry: Any, base: str, repository: str, *, size_bytes: int = 64 * 1024
) -> tuple[str, str]:
    """Push a new image of its own as ``<registry>/<repository>:v1``; (the reference, its digest). The local copy is
    removed, so the engine must pull it."""
    local = sized_image(client, base, f"gpucp-pull-src-{uuid.uuid4().hex[:10]}:v1", size_bytes)
    try:
        digest = registry.push(client, local, repository, "v1")
    finally:
        remove_image(client, local)
    return f"{registry.host}/{repository}:v1", digest


def remove_image(client: Any, *names: str) -> None:
    """Remove every local tag of these references (and the image once untagged); a missing one is fine."""
    for name in names:
        try:
            client.images.remove(name, force=True)
        except (ImageNotFound, APIError):
            pass


def remove_repository(client: Any, repository: str) -> None:
    """Remove every local image of ``repository`` (host/path), whatever its tags or digests, and first the
    containers made from them (the images are each test's own), which would otherwise keep them untagged."""
    for image in client.images.list(name=repository):
        for container in client.containers.list(all=True, filters={"ancestor": image.id}):
            try:
                container.remove(force=True)
            except APIError:
                pass
        for tag in image.tags:
            remove_image(client, tag)
        for digest in image.attrs.get("RepoDigests") or []:
            remove_image(client, digest)
