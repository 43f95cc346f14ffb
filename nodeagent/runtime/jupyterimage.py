"""A local JupyterLab image for the tests, built without any registry.

``gpucp-jupyter:test`` is the busybox userland of ``gpucp-busybox:test`` (``localimage``) plus the CPython that
runs this builder and JupyterLab installed for it from the package index. No base image is needed:

- the interpreter is copied from its own prefix (``sys.base_prefix``) to the same prefix in the image (its
  ``RUNPATH`` and compiled-in paths point there): ``bin/python3.X`` and the standard library without its test
  suites, Tk, IDLE, the static library and the host's ``site-packages``;
- ``pip install --prefix`` puts JupyterLab and ipykernel (``PACKAGES``, wheels only) into that prefix's
  ``site-packages``, its scripts into ``bin`` (their ``#!`` line rewritten to the image's interpreter) and its
  data files (the lab's static assets, the kernel spec) into ``share/jupyter``;
- every ELF file of the image (the interpreter, the extension modules, the wheels' bundled libraries) is run
  through ``ldd``, and the host's shared libraries they need (libc, the loader, libssl, libsqlite3, libffi, ...)
  are copied to the same paths, with the symbolic links on the way.

The default command serves JupyterLab on 127.0.0.1:8888 in ``/workspace`` (the container runs with no network but
its loopback; the node agent's SSH gateway forwards to it), with the token from ``JUPYTER_TOKEN``, any ``Host``
accepted (a reverse proxy keeps the browser's), and WebSockets whose ``Origin`` matches the ``Host``. It runs as
root by default and as any other user too: ``HOME`` (``/home/jupyter``) and ``/workspace`` are writable by all.

The build is skipped when an image of the same version (busybox, the interpreter, the builders' source, the pinned
packages) is present; pip's cache makes a forced rebuild quick. Run ``python -m nodeagent.runtime.jupyterimage`` or
``scripts/build-test-image``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

import docker

from nodeagent.runtime import localimage
from nodeagent.runtime.localimage import add_dir, add_file, add_symlink, add_userland, find_busybox

DEFAULT_TAG = "gpucp-jupyter:test"
PACKAGES = ("jupyterlab==4.6.6", "ipykernel==7.4.0")
PORT = 8888
WORKSPACE = "/workspace"
HOME = "/home/jupyter"
# The non-root user the image also runs as (``--user 1000``); root stays the default, as for the busybox image.
USER_ID = 1000
USERS = (
    "root:x:0:0:root:/root:/bin/sh\n"
    f"jupyter:x:{USER_ID}:{USER_ID}:jupyter:{HOME}:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/:/bin/false\n"
)
GROUPS = f"root:x:0:\njupyter:x:{USER_ID}:\nnogroup:x:65534:\n"
# The lab's settings overrides: no news or update prompt (it would fetch from the internet, and its notification
# would cover part of the page a browser test reads).
LAB_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"}}

# Parts of the standard library a notebook server never uses (test suites, Tk, IDLE, the static library and the
# build's config directory): about 400 MB less to copy into every container.
_SKIPPED_DIRS = frozenset({"test", "tests", "idle_test", "idlelib", "tkinter", "turtledemo", "site-packages"})
_SKIPPED_DYNLOAD = re.compile(r"^(_test|_ctypes_test|_xxtestfuzz|xxlimited|_tkinter)")
# Data a notebook server never reads here, a third of the files (and each container's creation copies them all
# with the vfs storage driver): jedi's stubs of third-party packages (it keeps those of the standard library),
# Babel's locales other than English, and the packages' own test suites.
_PRUNED = ("jedi/third_party/typeshed/stubs", "jedi/third_party/django-stubs")
_BABEL_LOCALES = "babel/locale-data"
_KEPT_LOCALES = re.compile(r"^(root|en|en_US|en_GB)\.dat$")
_LDD_PATH = re.compile(r"(?:=>\s*|^\s*)(/\S+)\s+\(0x")
_LDD_MISSING = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
# Loaded with dlopen by glibc (thread cancellation, unwinding), so ldd never names it.
_DLOPENED = ("libgcc_s.so.1",)


class BuildError(RuntimeError):
    """The image cannot be built on this machine; the message says why."""


def interpreter() -> tuple[Path, str]:
    """The prefix of the CPython running this builder (a virtual environment's base) and its ``python3.X``."""
    return Path(sys.base_prefix), f"python{sys.version_info.major}.{sys.version_info.minor}"


def command(port: int = PORT) -> list[str]:
    """The image's default command: JupyterLab on the loopback ``port``."""
    prefix, _ = interpreter()
    return [
        str(prefix / "bin" / "jupyter-lab"),
        "--ip=127.0.0.1",
        f"--port={port}",
        "--no-browser",
        "--allow-root",
        "--ServerApp.allow_remote_access=True",
        # The extension manager would ask the package index, which a container with no network cannot reach.
        "--LabApp.extension_manager=readonly",
        f"--ServerApp.root_dir={WORKSPACE}",
    ]


def changes() -> list[str]:
    """The image's configuration, as ``docker import`` instructions."""
    prefix, _ = interpreter()
    cmd = ", ".join(f'"{arg}"' for arg in command())
    return [
        f"ENV PATH=/usr/local/bin:{prefix}/bin:/bin",
        f"ENV HOME={HOME}",
        "ENV SHELL=/bin/sh",
        f"WORKDIR {WORKSPACE}",
        f"EXPOSE {PORT}",
        f"CMD [{cmd}]",
    ]


def version(busybox: Path) -> str:
    """Changes with what goes into the image: rebuilt rather than reused when any of it does."""
    prefix, python = interpreter()
    binary = prefix / "bin" / python
    digest = hashlib.sha256(busybox.read_bytes())
    for part in (sys.version, str(prefix), platform.machine(), str(binary.stat().st_size), *PACKAGES, *changes()):
        digest.update(part.encode() + b"\0")
    for module in (localimage.__file__, __file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()[:16]


def install_packages(target_prefix: Path) -> None:
    """pip installs ``PACKAGES`` for this interpreter under ``target_prefix`` (laid out as the image's prefix)."""
    prefix, python = interpreter()
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--ignore-installed",
        "--only-binary=:all:",
        "--prefix",
        str(target_prefix),
        *PACKAGES,
    ]
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"pip could not install {' '.join(PACKAGES)}:\n{result.stderr.strip()}")
    # pip writes the running interpreter (a virtual environment's) into the scripts' #! lines.
    running, image_python = os.fsencode(sys.executable), os.fsencode(prefix / "bin" / python)
    for script in (target_prefix / "bin").iterdir():
        data = script.read_bytes() if script.is_file() and not script.is_symlink() else b""
        if data.startswith(b"#!"):
            script.write_bytes(data[:512].replace(running, image_python) + data[512:])


def prune(site_packages: Path) -> None:
    """Removes ``_PRUNED``, Babel's other locales and the ``tests`` packages from an installed ``site-packages``."""
    for name in _PRUNED:
        shutil.rmtree(site_packages / name, ignore_errors=True)
    for locale in (site_packages / _BABEL_LOCALES).glob("*.dat"):
        if not _KEPT_LOCALES.match(locale.name):
            locale.unlink()
    for tests in sorted(site_packages.glob("*/tests")) + sorted(site_packages.glob("*/*/tests")):
        if tests.is_dir():
            shutil.rmtree(tests)


def _stdlib_files(prefix: Path, python: str) -> Iterator[Path]:
    stdlib = prefix / "lib" / python
    for root, dirs, files in os.walk(stdlib):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith("config-"))
        for name in sorted(files):
            if ".opt-" in name or name.endswith(".a"):
                continue
            if here.name == "lib-dynload" and _SKIPPED_DYNLOAD.match(name):
                continue
            yield here / name


def _tree(top: Path) -> Iterator[Path]:
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            yield Path(root) / name


def is_elf(path: Path) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def shared_libraries(elf_files: Iterable[Path], *, inside: Path) -> set[Path]:
    """The host libraries ``elf_files`` load (by ``ldd``, so transitively), less those under ``inside`` (the image
    tree's own: a wheel's bundled libraries). A library ldd cannot find fails the build."""
    needed: set[Path] = set()
    missing: dict[str, set[str]] = {}
    for path in elf_files:
        result = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
        if result.returncode != 0:  # a static binary, or another architecture's (debugpy ships some)
            continue
        for line in result.stdout.splitlines():
            match = _LDD_PATH.search(line)
            if match and not Path(match.group(1)).is_relative_to(inside):
                needed.add(Path(match.group(1)))
        for name in _LDD_MISSING.findall(result.stdout):
            missing.setdefault(name, set()).add(str(path.relative_to(inside) if path.is_relative_to(inside) else path))
    if missing:
        lines = "\n".join(f"  {name} (for {', '.join(sorted(users))})" for name, users in sorted(missing.items()))
        raise BuildError(f"shared libraries not found on this machine:\n{lines}")
    return needed


class RootfsWriter:
    """Adds files to the image's tarball once each, with their parent directories, as root's."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.names = set(tar.getnames())

    def parents(self, name: str) -> None:
        for parent in reversed(PurePosixPath(name).parents[:-1]):
            self.directory(str(parent))

    def directory(self, name: str, mode: int = 0o755) -> None:
        if name not in self.names:
            self.parents(name)
            self.names.add(name)
            add_dir(self.tar, name, mode)

    def file(self, name: str, data: bytes, mode: int = 0o644) -> None:
        self.parents(name)
        self.names.add(name)
        add_file(self.tar, name, data, mode)

    def symlink(self, name: str, target: str) -> None:
        if name not in self.names:
            self.parents(name)
            self.names.add(name)
            add_symlink(self.tar, name, target)

    def host(self, path: Path, name: str | None = None) -> None:
        """A file, symbolic link or directory of the host, at ``name`` (its own absolute path by default), with
        its mode and modification time (a byte-compiled module is only used when its source's matches)."""
        name = name or str(path).lstrip("/")
        if name in self.names:
            return
        self.parents(name)
        self.names.add(name)
        info = self.tar.gettarinfo(str(path), arcname=name)
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        if info.isreg():
            with path.open("rb") as f:
                self.tar.addfile(info, f)
        else:
            self.tar.addfile(info)

    def host_library(self, path: Path) -> None:
        """A host library at the path the loader found it, with every symbolic link on the way (``/lib`` to
        ``usr/lib`` on a merged-/usr system, ``libssl.so.3`` to its versioned file), so that path leads to it."""
        current, parts, links = Path("/"), list(path.parts[1:]), 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                current = current.parent
                continue
            here = current / part
            if not here.is_symlink():
                current = here
                continue
            links += 1
            if links > 40:
                raise BuildError(f"too many symbolic links resolving {path}")
            self.host(here)
            target = Path(os.readlink(here))
            if target.is_absolute():
                current, parts = Path("/"), [*target.parts[1:], *parts]
            else:
                parts = [*target.parts, *parts]
        if not current.is_file():
            raise BuildError(f"{path} is not a file")
        self.host(current)


def write_rootfs(out: Path, busybox: Path, staging: Path) -> None:
    """Writes the image's root file system to ``out``; ``staging`` holds the pip-installed prefix."""
    prefix, python = interpreter()
    staged_prefix = staging / str(prefix).lstrip("/")
    install_packages(staged_prefix)
    for packages in (p for p in staged_prefix.rglob("*-packages") if p.name in {"site-packages", "dist-packages"}):
        prune(packages)
    binary = prefix / "bin" / python
    stdlib = list(_stdlib_files(prefix, python))
    staged = list(_tree(staged_prefix))
    elf_files = [binary, *(p for p in stdlib if p.suffix == ".so"), *(p for p in staged if is_elf(p))]
    libraries = shared_libraries(elf_files, inside=staging)
    libc = next((lib for lib in libraries if lib.name == "libc.so.6"), None)
    if libc is None:
        raise BuildError(f"ldd found no C library for {binary}")
    libraries.update(libc.parent / name for name in _DLOPENED if (libc.parent / name).exists())

    with tarfile.open(out, mode="w") as tar:
        add_userland(tar, busybox, users=USERS, groups=GROUPS)
        rootfs = RootfsWriter(tar)
        rootfs.directory(HOME.lstrip("/"), 0o777)
        rootfs.directory(WORKSPACE.lstrip("/"), 0o777)
        rootfs.host(binary)
        for path in stdlib:
            rootfs.host(path)
        for path in staged:
            rootfs.host(path, str(prefix / path.relative_to(staged_prefix)).lstrip("/"))
        for library in sorted(libraries):
            rootfs.host_library(library)
        bindir = str(prefix / "bin").lstrip("/")
        overrides = str(prefix / "share/jupyter/lab/settings/overrides.json").lstrip("/")
        rootfs.file(overrides, json.dumps(LAB_OVERRIDES, indent=2).encode())
        rootfs.symlink(f"{bindir}/python3", python)
        rootfs.symlink(f"{bindir}/python", python)
        for name in ("python3", "python"):
            rootfs.symlink(f"usr/local/bin/{name}", str(binary))


def ensure_jupyter_image(client: docker.DockerClient, tag: str = DEFAULT_TAG, *, force: bool = False) -> str:
    """Build ``tag`` unless an image of the same version is there already. Returns the image id."""
    busybox = find_busybox()
    image_version = version(busybox)
    if not force and (image_id := localimage.current_image(client, tag, image_version)) is not None:
        return image_id
    with tempfile.TemporaryDirectory(prefix="gpucp-jupyter-image-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        write_rootfs(rootfs, busybox, Path(tmp) / "staging")
        return localimage.import_rootfs(client, tag, rootfs, version=image_version, changes=changes())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tag = args[0] if args and not args[0].startswith("-") else DEFAULT_TAG
    client = docker.from_env(timeout=300)
    started = time.monotonic()
    try:
        image_id = ensure_jupyter_image(client, tag, force="--force" in args)
    except BuildError as exc:
        print(f"{tag}: {exc}", file=sys.stderr)
        return 1
    print(f"{tag} {image_id} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
