"""Images on a node: pulls from OCI registries (with a launch's or pre-pull's credentials, through a per-node
registry mirror when the operator set one), their progress and outcome as ``schema.ImageReport``s, and the node's
image cache with its disk budget.

Pulls go through the Docker SDK's low-level client (``POST /images/create``, the request ``client.api.pull``
makes), streamed, so the engine's progress lines become ``schema.PullProgress``. The SDK's own ``pull`` waits on
the engine without any timeout; a registry that stops sending would hold the thread for good, so the request is
made here with a read timeout (``stall_s``) and an overall deadline (``timeout_s``), and the connection is closed
when either passes: the engine then abandons the pull.

Credentials (``schema.RegistryAuth``) go to the engine only, in the request's ``X-Registry-Auth`` header, and only
when they are for the registry the image reference names (``nodeagent.imageref``); never to a mirror, never to a
log, never into a failure reason (the password is cut out of whatever the engine says).

The cache (``ImageCache``): the images this agent pulled (never an operator's own: an image that was present before
the pull is not the cache's), with their last use, kept in ``<state_dir>/images.json``. Over the budget, the least
recently used are untagged (removing the image once no other tag holds it), except those a container uses (any
container of the engine) and those a desired launch or a listed pre-pull still needs. See docs/runtime.md, "Images".
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import docker
from docker import auth as docker_auth
from docker.errors import APIError, DockerException, ImageNotFound
from docker.models.images import Image
from requests.exceptions import RequestException

from nodeagent import imageref, schema

log = logging.getLogger(__name__)

# The longest a pull may take, and the longest the engine may stay silent during one (it sends progress lines
# several times a second while it downloads or extracts).
PULL_TIMEOUT_S = 3600.0
PULL_STALL_S = 300.0
# A failed pre-pull the control plane still lists is tried again this much later (the tenant may fix the
# credentials, or the registry may come back).
PREPULL_RETRY_S = 60.0
PREPULL_WORKERS = 2
ERROR_CHARS = 2000
# The most image reports the board remembers (delivered ones are forgotten first).
MAX_BOARD = 1024
CACHE_FILE = "images.json"

_LAYER_SEEN = {"Pulling fs layer", "Waiting", "Downloading", "Verifying Checksum", "Download complete", "Extracting"}
_LAYER_DOWNLOADED = {"Verifying Checksum", "Download complete", "Extracting"}
_LAYER_DONE = {"Pull complete", "Already exists"}


def _utcnow() -> datetime:
    return datetime.now(UTC)


class PullFailed(Exception):
    """A pull did not bring the image; the message is the reason, in words, for the tenant (no credentials)."""


def parse_mirror(text: str) -> tuple[str, str]:
    """``REGISTRY=MIRROR`` (``docker.io=127.0.0.1:5001``) as the registry (as ``imageref`` names it) and the
    mirror's host[:port]; ValueError naming the problem otherwise."""
    registry, sep, mirror = text.strip().partition("=")
    if not sep or not registry or not mirror:
        raise ValueError(f"a registry mirror is REGISTRY=HOST[:PORT] (docker.io=127.0.0.1:5001), got {text!r}")
    try:
        origin = imageref.parse(f"{registry}/x/y").registry
        host = imageref.parse(f"{mirror}/x/y").registry
    except imageref.ImageRefError as exc:
        raise ValueError(f"registry mirror {text!r}: {exc}") from None
    if "." not in mirror and ":" not in mirror and mirror != "localhost":
        raise ValueError(f"registry mirror {text!r}: the mirror is a host[:port], e.g. 127.0.0.1:5001")
    return origin, host


def failure_reason(message: str, image: str, secrets: Iterable[str] = ()) -> str:
    """The engine's or registry's words for a failed pull, led by what it means to a tenant; never a secret."""
    text = " ".join(str(message).split())
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    low = text.lower()
    if (
        "unauthorized" in low
        or "no basic auth credentials" in low
        or "authentication required" in low
        or ("denied" in low and "permission denied" not in low)
    ):
        what = f"unauthorized: the registry refused the credentials for {image}"
    elif "manifest unknown" in low or "not found" in low or "name unknown" in low:
        what = f"not found: the registry has no image {image}"
    elif "no space left" in low:
        what = f"no space: the node ran out of disk space pulling {image}"
    elif any(
        word in low
        for word in ("connection refused", "no such host", "i/o timeout", "dial tcp", "timeout", "unreachable", "eof")
    ):
        what = f"registry unreachable: the node could not reach the registry of {image}"
    else:
        what = f"the pull of {image} failed"
    return f"{what} ({text})"[:ERROR_CHARS]


@dataclass(frozen=True)
class Pulled:
    """An image on the node: how to name it to the engine, its id, the repository digest that resolved (None for
    an image built or loaded locally), its size, and whether this pull brought it (it was not here before)."""

    local: str
    image_id: str
    digest: str | None
    size: int
    pulled: bool


class Progress:
    """Folds the engine's pull lines into layers and bytes."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.layers: dict[str, dict[str, Any]] = {}
        self.digest: str | None = None

    def feed(self, line: Mapping[str, Any]) -> None:
        status = str(line.get("status") or "")
        if status.startswith("Digest: "):
            self.digest = status.removeprefix("Digest: ").strip() or None
            return
        layer = line.get("id")
        if not layer or not (status in _LAYER_SEEN or status in _LAYER_DONE):
            return
        state = self.layers.setdefault(str(layer), {"current": 0, "total": 0, "done": False})
        detail = line.get("progressDetail") or {}
        if status == "Downloading":
            state["total"] = max(state["total"], int(detail.get("total") or 0))
            state["current"] = int(detail.get("current") or 0)
        elif status in _LAYER_DOWNLOADED:
            state["current"] = state["total"]
        elif status in _LAYER_DONE:
            state["current"] = state["total"]
            state["done"] = True

    def snapshot(self) -> schema.PullProgress:
        layers = list(self.layers.values())
        return schema.PullProgress(
            layers_done=min(10000, sum(1 for item in layers if item["done"])),
            layers_total=min(10000, len(layers)),
            bytes_done=sum(item["current"] for item in layers),
            bytes_total=sum(item["total"] for item in layers),
            seconds=round(time.monotonic() - self.started, 3),
        )


def repo_digest(attrs: Mapping[str, Any], image: str, *, also: Iterable[str] = ()) -> str | None:
    """The repository digest (``sha256:...``) of a local image for the reference ``image`` (or a mirror's name of
    it, ``also``), from the engine's ``RepoDigests``; None when the image came from no registry."""
    try:
        ref = imageref.parse(image)
    except imageref.ImageRefError:
        return None
    if ref.digest:
        return ref.digest
    names = {ref.name, *(imageref.parse(name).name for name in also)}
    for entry in attrs.get("RepoDigests") or []:
        name, _, digest = str(entry).partition("@")
        with contextlib.suppress(imageref.ImageRefError):
            if imageref.parse(name).name in names and digest.startswith("sha256:"):
                return digest
    return None


class ImageBoard:
    """The latest ``ImageReport`` per image, kept until a heartbeat carrying it is answered. Thread-safe: pulls
    write it from their threads, the agent's loop reads it."""

    def __init__(self, clock: Callable[[], datetime] = _utcnow) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._latest: dict[str, schema.ImageReport] = {}
        self._unsent: set[str] = set()

    def put(self, image: str, state: str, *, reservations: Iterable[str] = (), **fields: Any) -> None:
        with self._lock:
            previous = self._latest.get(image)
            names = sorted({*(previous.reservations if previous else []), *reservations})[:256]
            report = schema.ImageReport(image=image, state=state, reservations=names, at=self.clock(), **fields)
            self._latest[image] = report
            self._unsent.add(image)
            if len(self._latest) > MAX_BOARD:
                # A long-lived agent pulls many images: forget the oldest reports already delivered.
                delivered = sorted((r.at, name) for name, r in self._latest.items() if name not in self._unsent)
                for _, name in delivered[: len(self._latest) - MAX_BOARD]:
                    del self._latest[name]

    def get(self, image: str) -> schema.ImageReport | None:
        with self._lock:
            return self._latest.get(image)

    def unsent(self) -> list[schema.ImageReport]:
        with self._lock:
            return [self._latest[image] for image in sorted(self._unsent)][: schema.MAX_PREPULLS]

    def sent(self, reports: Iterable[schema.ImageReport]) -> None:
        """A heartbeat carrying ``reports`` was answered: they need not go again, unless one changed since."""
        with self._lock:
            for report in reports:
                latest = self._latest.get(report.image)
                if latest is not None and latest.at <= report.at and latest.state == report.state:
                    self._unsent.discard(report.image)


@dataclass
class _Entry:
    names: list[str]
    image_id: str
    size: int
    last_used: float


@dataclass
class ImageCache:
    """The images this agent pulled, their last use, and the disk budget (None: no budget, nothing is evicted)."""

    client: docker.DockerClient
    path: Path | None = None
    budget_bytes: int | None = None
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _needed: dict[str, frozenset[str]] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def __post_init__(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            saved = json.loads(self.path.read_text())
            for image, item in saved["images"].items():
                self._entries[image] = _Entry(
                    names=[str(n) for n in item["names"]],
                    image_id=str(item["image_id"]),
                    size=int(item["size"]),
                    last_used=float(item["last_used"]),
                )

    def need(self, source: str, images: Iterable[str]) -> None:
        """The images ``source`` (the runtime's desired launches, the agent's pre-pulls) needs: never evicted."""
        with self._lock:
            self._needed[source] = frozenset(images)

    def record(self, image: str, pulled: Pulled, names: Iterable[str]) -> None:
        with self._lock:
            self._entries[image] = _Entry(
                names=sorted(set(names)), image_id=pulled.image_id, size=pulled.size, last_used=time.time()
            )
            self._save()

    def touch(self, image: str) -> None:
        with self._lock:
            entry = self._entries.get(image)
            if entry is not None:
                entry.last_used = time.time()
                self._save()

    def images(self) -> dict[str, float]:
        """The cached images and their last use (epoch seconds)."""
        with self._lock:
            return {image: entry.last_used for image, entry in self._entries.items()}

    def used_bytes(self) -> int:
        with self._lock:
            return sum({entry.image_id: entry.size for entry in self._entries.values()}.values())

    def evict(self, keep: Iterable[str] = ()) -> list[str]:
        """Over the budget: untag the least recently used images this agent pulled until under it, keeping those in
        use by any container, needed, or in ``keep`` (the image a pull just brought). Returns the images removed."""
        if self.budget_bytes is None:
            return []
        with self._lock:
            if self.used_bytes() <= self.budget_bytes:
                return []
            needed = set(keep).union(*self._needed.values())
            in_use = {
                str(c.attrs.get("ImageID") or c.attrs.get("Image") or "")
                for c in self.client.containers.list(all=True, ignore_removed=True)
            }
            keep_ids = set(in_use)
            for image in needed:
                with contextlib.suppress(ImageNotFound, APIError):
                    keep_ids.add(str(self.client.images.get(image).id))
            removed: list[str] = []
            for image, entry in sorted(self._entries.items(), key=lambda item: item[1].last_used):
                if self.used_bytes() <= self.budget_bytes:
                    break
                if image in needed or entry.image_id in keep_ids:
                    continue
                gone = True
                for name in entry.names:
                    try:
                        self.client.images.remove(name, noprune=False)
                    except ImageNotFound:
                        pass
                    except APIError as exc:  # a container took it meanwhile: keep it
                        log.info("keeping image %s: %s", image, exc.explanation or exc)
                        gone = False
                if gone:
                    del self._entries[image]
                    removed.append(image)
                    log.info(
                        "image cache: removed %s (%d bytes) to stay within %d bytes",
                        image,
                        entry.size,
                        self.budget_bytes,
                    )
            self._save()
            return removed

    def _save(self) -> None:
        if self.path is None:
            return
        saved = {
            "images": {
                image: {"names": e.names, "image_id": e.image_id, "size": e.size, "last_used": e.last_used}
                for image, e in self._entries.items()
            }
        }
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_text(json.dumps(saved) + "\n")
            tmp.replace(self.path)
        except OSError:
            log.exception("keeping the image cache's record in %s failed", self.path)


class ImagePuller:
    """Pulls images for launches and pre-pulls on one engine. ``mirrors`` maps a registry (``docker.io``) to the
    host of a pull-through cache for it; ``cache`` is the node's image cache; ``board`` collects the reports."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        mirrors: Mapping[str, str] | None = None,
        cache: ImageCache | None = None,
        board: ImageBoard | None = None,
        timeout_s: float = PULL_TIMEOUT_S,
        stall_s: float = PULL_STALL_S,
    ) -> None:
        self.client = client
        self.mirrors = dict(mirrors or {})
        self.cache = cache if cache is not None else ImageCache(client)
        self.board = board if board is not None else ImageBoard()
        self.timeout_s = timeout_s
        self.stall_s = stall_s

    def local(self, image: str) -> Pulled | None:
        """The image when the engine has it (by its reference, or by a mirror's name for it); None otherwise."""
        for name in self._names(image):
            try:
                found = self.client.images.get(name)
            except ImageNotFound:
                continue
            return self._pulled(found, image, name, pulled=False)
        return None

    def ensure(
        self,
        image: str,
        auth: schema.RegistryAuth | None = None,
        *,
        reservations: Iterable[str] = (),
        on_progress: Callable[[schema.PullProgress], None] | None = None,
    ) -> Pulled:
        """The image, pulled when the node lacks it. Raises ``PullFailed`` with the reason in words."""
        reservations = list(reservations)
        try:
            present = self.local(image)
        except (DockerException, RequestException) as exc:
            raise PullFailed(failure_reason(str(exc), image, self._secrets(auth))) from None
        if present is not None:
            self.board.put(image, "present", reservations=reservations, digest=present.digest, size_bytes=present.size)
            return present
        self.board.put(image, "pulling", reservations=reservations, progress=schema.PullProgress())

        def progress(snapshot: schema.PullProgress) -> None:
            self.board.put(image, "pulling", reservations=reservations, progress=snapshot)
            if on_progress is not None:
                on_progress(snapshot)

        try:
            result, last = self._pull(image, auth, progress)
        except PullFailed as exc:
            self.board.put(image, "failed", reservations=reservations, error=str(exc)[:ERROR_CHARS])
            raise
        self.board.put(
            image, "present", reservations=reservations, digest=result.digest, size_bytes=result.size, progress=last
        )
        with contextlib.suppress(DockerException, RequestException):
            self.cache.evict(keep=[image])
        return result

    # -- the pull ------------------------------------------------------------------------------------------

    def _names(self, image: str) -> list[str]:
        names = [image]
        with contextlib.suppress(imageref.ImageRefError):
            ref = imageref.parse(image)
            mirror = self.mirrors.get(ref.registry)
            if mirror:
                names.append(ref.with_registry(mirror).canonical)
        return names

    @staticmethod
    def _secrets(auth: schema.RegistryAuth | None) -> list[str]:
        return [auth.password] if auth is not None else []

    def _pull(
        self, image: str, auth: schema.RegistryAuth | None, progress: Callable[[schema.PullProgress], None]
    ) -> tuple[Pulled, schema.PullProgress]:
        try:
            ref = imageref.parse(image)
        except imageref.ImageRefError as exc:
            raise PullFailed(f"not an image reference: {exc}") from None
        # The tenant's credentials are for the registry they named, and go nowhere else.
        credentials = (
            auth if auth is not None and imageref.parse(f"{auth.registry}/x/y").registry == ref.registry else None
        )
        mirror = self.mirrors.get(ref.registry)
        if mirror:
            mirrored = ref.with_registry(mirror)
            try:
                digest, last = self._stream(mirrored, None, progress)
            except PullFailed as exc:
                log.warning("pull of %s through the mirror %s failed, trying its registry: %s", image, mirror, exc)
            else:
                found = self.client.images.get(mirrored.canonical)
                if not ref.digest:
                    # Tagged as the original reference, so a launch of it finds it by its own name.
                    found.tag(ref.name, tag=ref.tag or "latest")
                result = self._pulled(
                    found, image, image if not ref.digest else mirrored.canonical, pulled=True, digest=digest
                )
                self.cache.record(image, result, [mirrored.canonical, *([] if ref.digest else [image])])
                return result, last
        digest, last = self._stream(ref, credentials, progress)
        found = self.client.images.get(image)
        result = self._pulled(found, image, image, pulled=True, digest=digest)
        self.cache.record(image, result, [image])
        return result, last

    def _stream(
        self,
        ref: imageref.ImageRef,
        auth: schema.RegistryAuth | None,
        progress: Callable[[schema.PullProgress], None],
    ) -> tuple[str | None, schema.PullProgress]:
        """``POST /images/create`` for ``ref`` (what ``client.api.pull(stream=True, decode=True)`` sends), with a
        read timeout and a deadline; the digest the engine resolved, and the last progress."""
        api = self.client.api
        shown = ref.canonical
        secrets = self._secrets(auth)
        headers = {}
        if auth is not None:
            headers["X-Registry-Auth"] = docker_auth.encode_header(
                {"username": auth.username, "password": auth.password, "serveraddress": ref.registry}
            )
        # The engine reads the registry from the repository's name; docker.io is its default, named as it is.
        repository = ref.repository if ref.registry == imageref.DOCKER_HUB else ref.name
        params = {"fromImage": repository, "tag": ref.reference}
        state = Progress()
        deadline = time.monotonic() + self.timeout_s
        last = 0.0
        response = None
        try:
            # The SDK's pull, with a timeout (see the module's docstring).
            response = api._post(
                api._url("/images/create"),
                params=params,
                headers=headers,
                stream=True,
                timeout=(30, self.stall_s),
            )
            api._raise_for_status(response)
            for line in api._stream_helper(response, decode=True):
                if "error" in line:
                    detail = (line.get("errorDetail") or {}).get("message") or line["error"]
                    raise PullFailed(failure_reason(str(detail), shown, secrets))
                state.feed(line)
                now = time.monotonic()
                if now - last >= 0.5:
                    last = now
                    progress(state.snapshot())
                if now > deadline:
                    raise PullFailed(f"the pull of {shown} took longer than {self.timeout_s:g} s and was abandoned")
        except APIError as exc:
            raise PullFailed(failure_reason(str(exc.explanation or exc), shown, secrets)) from None
        except (RequestException, DockerException, OSError) as exc:
            if (
                time.monotonic() > deadline
                or "timed out" in str(exc).lower()
                or "timeout" in type(exc).__name__.lower()
            ):
                raise PullFailed(
                    f"registry unreachable: no progress pulling {shown} for {self.stall_s:g} s; the pull was abandoned"
                ) from None
            raise PullFailed(failure_reason(str(exc), shown, secrets)) from None
        finally:
            if response is not None:
                with contextlib.suppress(Exception):
                    response.close()
        last_progress = state.snapshot()
        progress(last_progress)
        return state.digest, last_progress

    def _pulled(self, found: Image, image: str, local: str, *, pulled: bool, digest: str | None = None) -> Pulled:
        mirrors = [name for name in self._names(image)[1:]]
        return Pulled(
            local=local,
            image_id=str(found.id),
            digest=digest or repo_digest(found.attrs, image, also=mirrors),
            size=int(found.attrs.get("Size") or 0),
            pulled=pulled,
        )


@dataclass
class _PrePullState:
    image: str
    state: str = "pulling"
    retry_at: datetime | None = None


class PrePuller:
    """The agent's pre-pulls: the images ``HeartbeatReply.prepull`` lists, pulled in the background (at most
    ``workers`` at a time) and kept out of the cache's eviction while listed. A failed one the reply still lists
    is tried again after ``retry_s``."""

    def __init__(
        self,
        puller: ImagePuller,
        *,
        workers: int = PREPULL_WORKERS,
        retry_s: float = PREPULL_RETRY_S,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.puller = puller
        self.retry = timedelta(seconds=retry_s)
        self.on_done = on_done
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="image-prepull")
        self._lock = threading.Lock()
        self._states: dict[str, _PrePullState] = {}

    def update(self, prepulls: Iterable[schema.PrePull], now: datetime) -> None:
        """The reply's pre-pulls: start those not pulled nor pulling (a failed one once its retry is due)."""
        listed = {item.image: item for item in prepulls}
        self.puller.cache.need("prepull", listed)
        with self._lock:
            for image in list(self._states):
                if image not in listed and self._states[image].state != "pulling":
                    del self._states[image]
            for image, item in listed.items():
                current = self._states.get(image)
                if current is not None and (
                    current.state in ("pulling", "present") or (current.retry_at is not None and now < current.retry_at)
                ):
                    continue
                self._states[image] = _PrePullState(image=image)
                self._pool.submit(self._pull, item, now)

    def state(self, image: str) -> str | None:
        with self._lock:
            current = self._states.get(image)
            return current.state if current is not None else None

    def _pull(self, item: schema.PrePull, now: datetime) -> None:
        outcome, retry_at = "present", None
        try:
            self.puller.ensure(item.image, item.registry_auth, reservations=item.reservations)
        except PullFailed as exc:
            log.warning("pre-pull of %s failed: %s", item.image, exc)
            outcome, retry_at = "failed", now + self.retry
        except Exception as exc:  # a bug must not kill the pool's thread silently
            log.exception("pre-pull of %s failed", item.image)
            self.puller.board.put(item.image, "failed", reservations=item.reservations, error=str(exc)[:ERROR_CHARS])
            outcome, retry_at = "failed", now + self.retry
        with self._lock:
            self._states[item.image] = _PrePullState(image=item.image, state=outcome, retry_at=retry_at)
        if self.on_done is not None:
            self.on_done()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def make_puller(
    client: docker.DockerClient,
    *,
    state_dir: Path | str,
    mirrors: Mapping[str, str] | None = None,
    cache_bytes: int | None = None,
    timeout_s: float = PULL_TIMEOUT_S,
    stall_s: float = PULL_STALL_S,
) -> ImagePuller:
    """The node's puller, its cache's record in ``<state_dir>/images.json``."""
    directory = Path(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    cache = ImageCache(client, path=directory / CACHE_FILE, budget_bytes=cache_bytes)
    return ImagePuller(client, mirrors=mirrors, cache=cache, timeout_s=timeout_s, stall_s=stall_s)
