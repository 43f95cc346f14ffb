"""A tiny local image for the tests and the demo, built without any registry.

No registry is reachable from the development and CI machines, so the image is made by ``docker import`` of a
tarball that holds Debian's static busybox binary (package ``busybox-static``) and a symlink per applet, plus
``gpucp-job``: a shell script that behaves like a well-mannered training job (it reacts to the end-of-window
warning and exits cleanly on SIGTERM). Run ``python -m nodeagent.runtime.localimage`` or ``scripts/build-test-image``.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import docker
from docker.errors import ImageNotFound

DEFAULT_TAG = "gpucp-busybox:test"
VERSION_LABEL = "gpucp.test-image.version"

# The job script: prints a heartbeat line, reports the warning (file contents) on SIGUSR1, and exits 0 on
# SIGTERM. ash runs traps only between commands, so it sleeps in short steps to react within a fraction of a
# second. GPUCP_JOB_SECONDS bounds the run (0: until stopped); GPUCP_JOB_EXIT sets the exit code at the end.
JOB_SCRIPT = """#!/bin/sh
echo "job start reservation=${GPUCP_RESERVATION:-?} gpus=${NVIDIA_VISIBLE_DEVICES:-none}"
trap 'echo "warning received: $(cat "${GPUCP_WARN_FILE:-/run/gpucp/warning}" 2>/dev/null)"' USR1
trap 'echo "terminating on SIGTERM"; exit 0' TERM
limit=${GPUCP_JOB_SECONDS:-0}
ticks=0
while [ "$limit" -eq 0 ] || [ "$ticks" -lt $((limit * 5)) ]; do
  sleep 0.2
  ticks=$((ticks + 1))
done
echo "job done"
exit "${GPUCP_JOB_EXIT:-0}"
"""


def find_busybox() -> Path:
    """The static busybox binary: a dynamic one would need a libc the image does not have."""
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        path = Path(candidate)
        if path.is_file():
            return path.resolve()
    found = shutil.which("busybox")
    if found:
        return Path(found).resolve()
    raise FileNotFoundError("busybox is not installed (Debian/Ubuntu: apt-get install -y busybox-static)")


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True).stdout
    return sorted({name.strip() for name in out.split() if name.strip() and "/" not in name})


USERS = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
GROUPS = "root:x:0:\nnogroup:x:65534:\n"


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def add_symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    tar.addfile(info)


def add_userland(tar: tarfile.TarFile, busybox: Path, *, users: str = USERS, groups: str = GROUPS) -> None:
    """The base every local image shares: the top directories, busybox with a symlink per applet in ``bin``
    (``/bin/sh`` among them), and ``/etc/passwd`` and ``/etc/group``."""
    for d in ("bin", "etc", "usr", "usr/local", "usr/local/bin", "proc", "sys", "dev", "run", "var"):
        add_dir(tar, d)
    add_dir(tar, "tmp", 0o1777)
    add_file(tar, "bin/busybox", busybox.read_bytes(), 0o755)
    for applet in _applets(busybox):
        if applet != "busybox":
            add_symlink(tar, f"bin/{applet}", "busybox")
    add_file(tar, "etc/passwd", users.encode(), 0o644)
    add_file(tar, "etc/group", groups.encode(), 0o644)


def build_rootfs(busybox: Path) -> bytes:
    """The image's root file system as an uncompressed tarball."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_userland(tar, busybox)
        add_file(tar, "usr/local/bin/gpucp-job", JOB_SCRIPT.encode(), 0o755)
    return buf.getvalue()


def _version(busybox: Path) -> str:
    """Changes when the binary or the job script does, so a stale image is rebuilt rather than reused."""
    digest = hashlib.sha256(busybox.read_bytes())
    digest.update(JOB_SCRIPT.encode())
    return digest.hexdigest()[:16]


def current_image(client: docker.DockerClient, tag: str, version: str) -> str | None:
    """The id of ``tag`` when it is there and carries ``version`` in its version label; None otherwise."""
    try:
        image = client.images.get(tag)
    except ImageNotFound:
        return None
    return str(image.id) if (image.labels or {}).get(VERSION_LABEL) == version else None


def import_rootfs(
    client: docker.DockerClient, tag: str, rootfs: bytes | Path, *, version: str, changes: list[str]
) -> str:
    """``docker import`` of a root file system tarball (its bytes, or a file for a large one) as ``tag``, with the
    Dockerfile instructions ``changes`` and the version label. Returns the image id."""
    repository, _, image_tag = tag.rpartition(":")
    if not repository:
        repository, image_tag = tag, "latest"
    changes = [*changes, f"LABEL {VERSION_LABEL}={version}"]
    if isinstance(rootfs, Path):
        client.api.import_image_from_file(str(rootfs), repository=repository, tag=image_tag, changes=changes)
    else:
        client.api.import_image_from_data(rootfs, repository=repository, tag=image_tag, changes=changes)
    return str(client.images.get(tag).id)


def ensure_busybox_image(client: docker.DockerClient, tag: str = DEFAULT_TAG, *, force: bool = False) -> str:
    """Build ``tag`` unless an image of the same version is there already. Returns the image id."""
    busybox = find_busybox()
    version = _version(busybox)
    if not force and (image_id := current_image(client, tag, version)) is not None:
        return image_id
    changes = ["ENV PATH=/usr/local/bin:/bin", 'CMD ["/usr/local/bin/gpucp-job"]']
    return import_rootfs(client, tag, build_rootfs(busybox), version=version, changes=changes)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tag = args[0] if args and not args[0].startswith("-") else DEFAULT_TAG
    client = docker.from_env(timeout=120)
    image_id = ensure_busybox_image(client, tag, force="--force" in args)
    print(f"{tag} {image_id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
