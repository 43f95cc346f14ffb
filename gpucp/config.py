"""Where gpucp keeps the server and the token: ``$XDG_CONFIG_HOME/gpucp/config.json`` (default ``~/.config``).

The token is a bearer secret, so the directory is 0700 and the file 0600 from the moment it exists: it is
written to a temporary file that ``mkstemp`` creates with mode 0600 in that directory, then renamed over the
old one, so no reader ever sees it half-written or with a wider mode. ``GPUCP_SERVER`` and ``GPUCP_TOKEN``
override what is stored (for scripts and CI), without writing anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from gpucp.errors import ConfigError

DEFAULT_SERVER = "http://127.0.0.1:8000"  # what `make run` serves
SERVER_ENV = "GPUCP_SERVER"
TOKEN_ENV = "GPUCP_TOKEN"  # noqa: S105  (the variable's name, not a secret)


@dataclass
class Config:
    server: str | None = None
    token: str | None = None
    token_id: int | None = None  # to revoke it at logout without listing every token
    username: str | None = None
    # True when `gpucp login` created this token from a password: a later login may then revoke it. A token
    # given with --token may be shared with other tools, and only `gpucp logout` revokes it.
    issued_by_login: bool = False


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    # The XDG spec says a relative value is invalid and is to be ignored.
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "gpucp"


def config_path() -> Path:
    return config_dir() / "config.json"


def load() -> Config:
    path = config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config()
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror}.") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}); fix it or remove it and log in again.") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object; remove it and log in again.")
    _warn_if_open(path)
    known = {f.name for f in fields(Config)}
    return Config(**{k: v for k, v in data.items() if k in known})


def save(config: Config) -> Path:
    directory = config_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    # An existing directory keeps the mode it was made with: narrow it, it is ours alone.
    os.chmod(directory, 0o700)
    path = directory / "config.json"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".config.", suffix=".tmp")  # O_EXCL, mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(config), out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename is only durable once the directory's entry is on disk too.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def _warn_if_open(path: Path) -> None:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"gpucp: warning: {path} is readable by others (mode {stat.S_IMODE(mode):04o}); run chmod 600 on it.",
            file=sys.stderr,
        )


def resolve_server(config: Config, given: str | None = None) -> str:
    """The server to talk to: ``given`` (an option), else GPUCP_SERVER, else the stored one, else make run's."""
    server = (given or os.environ.get(SERVER_ENV) or config.server or DEFAULT_SERVER).strip().rstrip("/")
    if not server.startswith(("http://", "https://")):
        raise ConfigError(f"The server must be an http:// or https:// URL, not {server!r}.")
    return server


def resolve_token(config: Config) -> str | None:
    return os.environ.get(TOKEN_ENV) or config.token
