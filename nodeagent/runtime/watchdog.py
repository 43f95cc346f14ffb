"""The lease watchdog: a replaceable container stops itself once its node agent's lease has run out, even when the
agent is dead or frozen (DESIGN invariant 8; docs/runtime.md, "Lease watchdog").

The agent writes the lease's deadline (epoch seconds) into ``<state dir>/watchdog/deadline`` on every answered
heartbeat. That directory is bind-mounted read-only into every replaceable container at ``/run/gpucp/lease`` (a
directory, not the file: the agent replaces the file by a rename, which a file mount would never show), and the
container's entrypoint is ``watchdog.sh`` (beside this module) running the image's own entrypoint and command as
its child. Work nothing would replace is not wrapped: it runs through a control-plane outage.
"""

from __future__ import annotations

import math
import os
import shutil
import struct
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from nodeagent import schema
from nodeagent.runtime.containers import MOUNT_POINT

SCRIPT = Path(__file__).with_name("watchdog.sh")
LEASE_MOUNT = f"{MOUNT_POINT}/lease"
SCRIPT_MOUNT = f"{MOUNT_POINT}/watchdog.sh"
BUSYBOX_MOUNT = f"{MOUNT_POINT}/busybox"
DEADLINE = "deadline"
# The watchdog acts this long after the agent's own fence would have (seconds, on top of rounding up).
AFTER_THE_AGENT_S = 1
_PT_INTERP = 3


def lease_dir(state_dir: Path | str) -> Path:
    """Where the agent keeps the deadline the watchdogs read: one directory per node agent's state."""
    return Path(state_dir) / "watchdog"


def write_deadline(directory: Path, deadline: datetime | None) -> None:
    """Renew (or, with None, withdraw) the lease every watchdog reads: the whole second after the lease's end, plus
    one. A live agent fences at the lease's end itself, with the notice first; the watchdog, polling once a second,
    acts between one and three seconds later, only when the agent did not (docs/runtime.md, "Lease watchdog")."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)  # noqa: S103 - the job may run as any user; nothing secret lives here
    target = directory / DEADLINE
    if deadline is None:
        target.unlink(missing_ok=True)
        return
    tmp = directory / f".{DEADLINE}.tmp"
    tmp.write_text(f"{math.ceil(deadline.timestamp()) + AFTER_THE_AGENT_S}\n")
    os.chmod(tmp, 0o644)
    # A rename: a watchdog never reads half a number, and the directory mount shows the new file at once.
    tmp.replace(target)


def read_deadline(directory: Path) -> datetime | None:
    """The deadline the watchdogs read now, or None when there is none."""
    try:
        return datetime.fromtimestamp(int((directory / DEADLINE).read_text().strip()), tz=UTC)
    except (OSError, ValueError, OverflowError):
        return None


def static_busybox() -> Path | None:
    """The host's busybox when it is statically linked (it runs in any image, without the image's libc)."""
    found = shutil.which("busybox")
    if not found:
        return None
    path = Path(found).resolve()
    return path if is_static_elf(path) else None


def is_static_elf(path: Path) -> bool:
    """True for an ELF executable with no program interpreter (no dynamic loader to find in the image)."""
    try:
        with path.open("rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF":
                return False
            wide, order = ident[4] == 2, "<" if ident[5] == 1 else ">"
            if wide:
                phoff, phentsize, phnum = (
                    struct.unpack_from(order + "Q", ident, 32)[0],
                    *struct.unpack_from(order + "HH", ident, 54),
                )
            else:
                phoff, phentsize, phnum = (
                    struct.unpack_from(order + "I", ident, 28)[0],
                    *struct.unpack_from(order + "HH", ident, 42),
                )
            for i in range(phnum):
                f.seek(phoff + i * phentsize)
                (kind,) = struct.unpack(order + "I", f.read(4))
                if kind == _PT_INTERP:
                    return False
            return True
    except (OSError, struct.error):
        return False


def image_argv(image_config: dict[str, Any], command: list[str]) -> list[str]:
    """What the container would run unwrapped, as Docker decides it: the image's entrypoint followed by the
    launch's command, or the image's own command when the launch gives none."""
    entrypoint = image_config.get("Entrypoint") or []
    if isinstance(entrypoint, str):
        entrypoint = ["/bin/sh", "-c", entrypoint]
    cmd = list(command) or list(image_config.get("Cmd") or [])
    return [*entrypoint, *cmd]


def wrap(
    args: dict[str, Any],
    spec: schema.DesiredContainer,
    *,
    image_config: dict[str, Any],
    lease: Path,
    busybox: Path | None,
) -> dict[str, Any]:
    """``containers.create`` arguments with the watchdog as PID 1 around the image's entrypoint and command."""
    volumes = dict(args.get("volumes") or {})
    volumes[str(lease)] = {"bind": LEASE_MOUNT, "mode": "ro"}
    volumes[str(SCRIPT)] = {"bind": SCRIPT_MOUNT, "mode": "ro"}
    env = dict(args.get("environment") or {})
    env.update({"GPUCP_LEASE_FILE": f"{LEASE_MOUNT}/{DEADLINE}", "GPUCP_STOP_GRACE_S": str(spec.stop_grace_s)})
    if busybox is not None:
        volumes[str(busybox)] = {"bind": BUSYBOX_MOUNT, "mode": "ro"}
        env["GPUCP_WATCHDOG_BUSYBOX"] = BUSYBOX_MOUNT
        entrypoint = [BUSYBOX_MOUNT, "sh", SCRIPT_MOUNT]
    else:
        entrypoint = ["/bin/sh", SCRIPT_MOUNT]
    return {
        **args,
        "volumes": volumes,
        "environment": env,
        "entrypoint": entrypoint,
        "command": image_argv(image_config, list(spec.command)),
    }


def prepare_mount_dir(mount_dir: Path, *, busybox: bool) -> None:
    """The mount points of the watchdog's files inside the launch's own ``/run/gpucp`` directory: that one is
    mounted read-only, so the engine could not create them there itself."""
    (mount_dir / "lease").mkdir(exist_ok=True)
    for name in ("watchdog.sh", *(["busybox"] if busybox else [])):
        (mount_dir / name).touch(exist_ok=True)
