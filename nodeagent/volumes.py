"""Project volumes and operator datasets on a node: where they live, the checks before a mount, and how much
they hold.

The volume root is shared storage in production (an NFS or CephFS mount that every server has at the same
path), so what a job wrote on one server is there for the project's next job on another; on one machine it
is a plain directory. A volume is ``<root>/<project>/<name>``, created on its first mount; a dataset is
``<dataset root>/<name>`` (default dataset root: ``<root>/.datasets``, which no project slug can name),
filled by the operator and never created by the agent.

Usage is measured as ``du -sx`` measures it, in a background thread: a walk of a large volume on network
storage takes minutes, which neither the heartbeat loop nor a launch may wait on when a recent measurement
will do. Measurements wait in a queue for the next heartbeat and stay there until one is answered.
See docs/runtime.md, "Volumes".
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nodeagent import schema

log = logging.getLogger(__name__)

MEASURE_INTERVAL_S = 60.0
# The container's user is whatever its image says, so a volume must be writable by any user; the directory is
# reachable only through its project's mounts (the project directory above it is not listable by others).
VOLUME_MODE = 0o777
PROJECT_MODE = 0o711
# The background thread looks for due measurements this often at most, so a newly desired volume waits for
# its first periodic measurement no longer than this beyond the interval.
MAX_TICK_S = 5.0
MAX_UNSENT = schema.MAX_CONTAINERS * schema.MAX_VOLUMES

VolumeKey = tuple[str, str]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class VolumeRefused(Exception):
    """A mount cannot be made; the message is the launch's failure reason, for the tenant to read."""


@dataclass(frozen=True)
class HostMount:
    """A checked directory on this node and where it goes in the container."""

    source: Path
    target: str
    read_only: bool


def disk_usage(path: Path) -> int:
    """The bytes allocated under ``path``, not counting the directory itself, as ``du -sx`` counts them: blocks
    rather than file sizes (a sparse file costs what it holds), symbolic links never followed, another file
    system mounted inside not entered, a file with several hard links counted once."""
    top = os.lstat(path)
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [str(path)]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed (or replaced) by the job while we walk
        except PermissionError as exc:
            # Root-squashed network storage may hide a job's private directory; count what can be seen.
            log.warning("volume usage: cannot read %s (%s); it is not counted", directory, exc)
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if info.st_dev != top.st_dev:
                continue
            is_dir = stat.S_ISDIR(info.st_mode)
            if not is_dir and info.st_nlink > 1:
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            total += info.st_blocks * 512
            if is_dir:
                stack.append(entry.path)
    return total


def format_bytes(count: int) -> str:
    """``10.4 GiB``, ``512 MiB``: one decimal at most, binary units as ``du -h`` uses them."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            text = f"{value:.1f}".removesuffix(".0")
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def over_limit_reason(project: str, name: str, used: int, limit: int) -> str:
    used_text, limit_text = format_bytes(used), format_bytes(limit)
    if used_text == limit_text:  # just over: rounding would read as "10 GiB used of 10 GiB"
        used_text, limit_text = f"{used} bytes", f"{limit} bytes"
    return (
        f"volume {project}/{name}: volume data is over its limit: {used_text} used of {limit_text}; "
        "free space or raise the limit, then book again"
    )


class VolumeStore:
    """This node's volume root and dataset root: checked mounts, usage measurement and the usage queue.

    ``clock`` gives the wall time of a measurement (and says whether the last one is stale); the background
    thread (``start``) waits in real time.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        dataset_root: Path | str | None = None,
        measure_interval_s: float = MEASURE_INTERVAL_S,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        given = Path(root)
        # Never created here: a missing root usually means the shared file system is not mounted, and a local
        # directory in its place would silently split the volumes between servers.
        if not given.is_dir():
            raise ValueError(f"the volume root {given} is not a directory (is the shared file system mounted?)")
        self.root = given.resolve(strict=True)
        self.dataset_root = Path(dataset_root).resolve() if dataset_root is not None else self.root / ".datasets"
        if measure_interval_s <= 0:
            raise ValueError(
                f"the volume measure interval must be a positive number of seconds, got {measure_interval_s}"
            )
        self.measure_interval = timedelta(seconds=measure_interval_s)
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[VolumeKey, schema.VolumeUsage] = {}
        self._unsent: dict[VolumeKey, schema.VolumeUsage] = {}
        self._tracked: frozenset[VolumeKey] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- mounts --------------------------------------------------------------------------------------------

    def volume_path(self, project: str, name: str) -> Path:
        return self.root / project / name

    def dataset_path(self, name: str) -> Path:
        return self.dataset_root / name

    def prepare(self, mounts: Sequence[schema.VolumeMount]) -> list[HostMount]:
        """The host directories for a launch's mounts, volumes created on first use; raises ``VolumeRefused``
        when a path is not allowed, a dataset is missing, or a volume is over its limit (measured now when
        the last measurement is older than the interval)."""
        prepared: list[HostMount] = []
        for mount in mounts:
            problem = schema.mount_path_problem(mount.path)
            if problem is not None:
                raise VolumeRefused(f"mount path {mount.path}: {problem}")
            if mount.kind == "dataset":
                source = self._directory(self.dataset_root, [mount.name], what=f"dataset {mount.name}", create=False)
                prepared.append(HostMount(source=source, target=mount.path, read_only=True))
                continue
            assert mount.project is not None  # VolumeMount's validator: a volume names its project
            what = f"volume {mount.project}/{mount.name}"
            source = self._directory(self.root, [mount.project, mount.name], what=what, create=True)
            prepared.append(HostMount(source=source, target=mount.path, read_only=mount.read_only))
        for mount in mounts:
            if mount.kind != "volume" or mount.limit_bytes is None:
                continue
            assert mount.project is not None
            usage = self.usage(mount.project, mount.name)
            if usage is not None and usage.used_bytes > mount.limit_bytes:
                raise VolumeRefused(over_limit_reason(mount.project, mount.name, usage.used_bytes, mount.limit_bytes))
        return prepared

    def _directory(self, base: Path, parts: list[str], *, what: str, create: bool) -> Path:
        """``base/parts...`` as a real directory inside ``base``: no component a symbolic link, nothing that
        resolves elsewhere. The names are validated by the schema already; this holds against what is on disk
        (a link an operator or a host user left, a dataset that is a link to elsewhere)."""
        path = base
        for part in parts:
            if part in ("", ".", "..") or "/" in part or "\x00" in part:
                raise VolumeRefused(f"{what}: {part!r} is not a valid name")
            path = path / part
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                if not create:
                    raise VolumeRefused(
                        f"{what} does not exist on this node; an operator puts datasets under the dataset root"
                    ) from None
                info = self._make_directory(path, VOLUME_MODE if part == parts[-1] else PROJECT_MODE)
            except OSError as exc:
                raise VolumeRefused(f"{what}: the node cannot read its storage ({exc.strerror})") from None
            if stat.S_ISLNK(info.st_mode):
                raise VolumeRefused(f"{what} is a symbolic link on this node; only real directories are mounted")
            if not stat.S_ISDIR(info.st_mode):
                raise VolumeRefused(f"{what} is not a directory on this node")
        resolved = path.resolve(strict=True)
        if resolved != path or not resolved.is_relative_to(base):
            raise VolumeRefused(f"{what} resolves outside its root on this node; it is not mounted")
        return path

    @staticmethod
    def _make_directory(path: Path, mode: int) -> os.stat_result:
        with contextlib.suppress(FileExistsError):  # another server (or launch) made it first: same result
            os.mkdir(path, mode)
            # O_NOFOLLOW: should a link take its place in between, the mode of its target is left alone.
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                os.fchmod(fd, mode)  # mkdir's mode is cut by the umask
            finally:
                os.close(fd)
        return os.lstat(path)

    # -- usage ---------------------------------------------------------------------------------------------

    def measure(self, project: str, name: str) -> schema.VolumeUsage | None:
        """Measure one volume now and queue the result; None when it does not exist (yet) or cannot be read."""
        path = self.volume_path(project, name)
        try:
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or not path.resolve(strict=True).is_relative_to(self.root):
                return None  # never walk through a link; prepare() refuses to mount it anyway
            used = disk_usage(path)
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("volume usage: cannot measure %s/%s (%s)", project, name, exc)
            return None
        usage = schema.VolumeUsage(project=project, name=name, used_bytes=used, measured_at=self.clock())
        key = (project, name)
        with self._lock:
            last = self._last.get(key)
            # Two measurements may race (a launch and the thread); the later one stands.
            if last is None or last.measured_at <= usage.measured_at:
                self._last[key] = usage
                self._unsent[key] = usage
        return usage

    def usage(self, project: str, name: str) -> schema.VolumeUsage | None:
        """The last measurement when it is recent enough, else a new one."""
        with self._lock:
            last = self._last.get((project, name))
        if last is not None and self.clock() - last.measured_at < self.measure_interval:
            return last
        return self.measure(project, name)

    def track(self, desired: Iterable[schema.DesiredContainer]) -> None:
        """The volumes the periodic measurement covers: those of the launches desired now."""
        self._tracked = frozenset(
            (mount.project, mount.name)
            for spec in desired
            for mount in spec.volumes
            if mount.kind == "volume" and mount.project is not None
        )

    def measure_due(self) -> int:
        """Measure every tracked volume whose last measurement is older than the interval; how many were."""
        now = self.clock()
        with self._lock:
            due = [
                key
                for key in sorted(self._tracked)
                if key not in self._last or now - self._last[key].measured_at >= self.measure_interval
            ]
        return sum(1 for project, name in due if self.measure(project, name) is not None)

    def unsent(self) -> list[schema.VolumeUsage]:
        """Measurements no answered heartbeat has carried yet, the latest per volume."""
        with self._lock:
            return sorted(self._unsent.values(), key=lambda u: (u.project, u.name))[:MAX_UNSENT]

    def sent(self, usages: Iterable[schema.VolumeUsage]) -> None:
        """A heartbeat carrying ``usages`` was answered: forget them, unless a newer measurement came since."""
        with self._lock:
            for usage in usages:
                key = (usage.project, usage.name)
                queued = self._unsent.get(key)
                if queued is not None and queued.measured_at <= usage.measured_at:
                    del self._unsent[key]

    # -- the background thread -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="volume-measure", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        tick = min(MAX_TICK_S, self.measure_interval.total_seconds())
        while not self._stop.wait(tick):
            try:
                self.measure_due()
            except Exception:  # a storage hiccup must not end the measurements for good
                log.exception("measuring volumes failed; trying again")
