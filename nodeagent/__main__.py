"""Command line: ``nodeagent probe`` and ``nodeagent run``.

Exit codes: 0 done, 2 bad usage or no GPU backend on this machine, 3 the control plane will not have this node.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from nodeagent.backends.base import BackendUnavailable, GpuBackend
from nodeagent.backends.simulated import SimulatedBackend, SimulatedSpecError
from nodeagent.collectors import HostCollector
from nodeagent.journal import DEFAULT_MAX_BYTES as DEFAULT_JOURNAL_MAX_BYTES
from nodeagent.journal import Journal
from nodeagent.runtime.base import ContainerRuntime, NullRuntime
from nodeagent.runtime.devices import GpuInfo

if TYPE_CHECKING:
    from nodeagent.logship import LogShipper
from nodeagent.volumes import VolumeStore

log = logging.getLogger("nodeagent")


def default_state_dir() -> str:
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return "/var/lib/nodeagent"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(base) / "nodeagent")


def make_backend(
    simulate: str | None,
    *,
    hostname: str,
    busy_source: Callable[[], set[str]] | None = None,
    kind: str = "auto",
) -> GpuBackend:
    """The simulated fleet when asked, else NVML or amdsmi; "auto" tries NVML, then amdsmi, and says why both
    are unavailable when neither is."""
    if simulate:
        return SimulatedBackend(simulate, hostname=hostname, busy_source=busy_source)
    from nodeagent.backends.amdsmi import AmdsmiBackend
    from nodeagent.backends.nvml import NvmlBackend

    if kind == "nvml":
        return NvmlBackend()
    if kind == "amdsmi":
        return AmdsmiBackend()
    try:
        return NvmlBackend()
    except BackendUnavailable as nvidia:
        try:
            return AmdsmiBackend()
        except BackendUnavailable as amd:
            raise BackendUnavailable(f"{nvidia} Nor is AMD's: {amd}") from amd


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="nodeagent", description="The GPU node agent.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail")
    sub = parser.add_subparsers(dest="command", required=True)

    probe = sub.add_parser("probe", help="print this machine's GPUs (facts and one sample)")
    probe.add_argument(
        "--simulate",
        metavar="SPEC",
        default=env("NODEAGENT_SIMULATE"),
        help="simulated GPUs instead of NVML, e.g. 8xH100-80GB",
    )
    probe.add_argument("--hostname", default=env("NODEAGENT_HOSTNAME"))
    probe.add_argument(
        "--backend",
        choices=("auto", "nvml", "amdsmi"),
        default=env("NODEAGENT_BACKEND") or "auto",
        help="where GPU facts come from: NVIDIA's NVML, AMD's amdsmi, or auto (NVML, then amdsmi)",
    )
    probe.add_argument("--json", action="store_true", help="print JSON (a recordable fixture) instead of a table")

    run = sub.add_parser("run", help="report to the control plane and run the containers it asks for")
    run.add_argument("--server", default=env("NODEAGENT_SERVER"), help="control plane URL (NODEAGENT_SERVER)")
    run.add_argument(
        "--join-token",
        default=env("NODEAGENT_JOIN_TOKEN"),
        help="one-time enrollment token (NODEAGENT_JOIN_TOKEN); not needed once enrolled",
    )
    run.add_argument(
        "--simulate",
        metavar="SPEC",
        default=env("NODEAGENT_SIMULATE"),
        help="simulated GPUs instead of NVML, e.g. 8xH100-80GB (NODEAGENT_SIMULATE)",
    )
    run.add_argument("--hostname", default=env("NODEAGENT_HOSTNAME"), help="name to report (NODEAGENT_HOSTNAME)")
    run.add_argument(
        "--backend",
        choices=("auto", "nvml", "amdsmi"),
        default=env("NODEAGENT_BACKEND") or "auto",
        help="NVIDIA's NVML, AMD's amdsmi, or auto: NVML, then amdsmi (NODEAGENT_BACKEND)",
    )
    run.add_argument(
        "--state-dir",
        default=env("NODEAGENT_STATE_DIR") or default_state_dir(),
        help="where the node credential, the lease, the desired state last heard and the journal are kept "
        "(NODEAGENT_STATE_DIR)",
    )
    run.add_argument(
        "--interval", type=float, default=5.0, help="heartbeat seconds until the control plane says otherwise"
    )
    run.add_argument("--sample-interval", type=float, default=1.0, help="GPU sampling seconds")
    run.add_argument(
        "--runtime",
        choices=("none", "docker"),
        default=env("NODEAGENT_RUNTIME") or "none",
        help="container runtime (NODEAGENT_RUNTIME)",
    )
    run.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=env("NODEAGENT_LISTEN") or "127.0.0.1:0",
        help="where to listen for the control plane's signed commands; port 0 picks a free one and the real "
        "address is reported (NODEAGENT_LISTEN, default 127.0.0.1:0)",
    )
    run.add_argument(
        "--volume-root",
        metavar="DIR",
        default=env("NODEAGENT_VOLUME_ROOT"),
        help="where project volumes live, <DIR>/<project>/<volume>: shared storage (NFS, CephFS) mounted at the "
        "same path on every server; without it, launches that mount volumes are refused (NODEAGENT_VOLUME_ROOT)",
    )
    run.add_argument(
        "--dataset-root",
        metavar="DIR",
        default=env("NODEAGENT_DATASET_ROOT"),
        help="where the operator's read-only datasets live (NODEAGENT_DATASET_ROOT, default <volume root>/.datasets)",
    )
    run.add_argument(
        "--volume-measure-s",
        type=float,
        default=env("NODEAGENT_VOLUME_MEASURE_S") or 60.0,
        help="seconds between measurements of the desired volumes' usage (NODEAGENT_VOLUME_MEASURE_S, default 60)",
    )
    run.add_argument(
        "--registry-mirror",
        metavar="REGISTRY=HOST",
        action="append",
        default=[item for item in (env("NODEAGENT_REGISTRY_MIRRORS") or "").replace(",", " ").split() if item],
        help="pull REGISTRY's images through the pull-through cache at HOST[:PORT] (e.g. "
        "docker.io=127.0.0.1:5001), falling back to REGISTRY when it fails; repeatable "
        "(NODEAGENT_REGISTRY_MIRRORS, comma-separated)",
    )
    run.add_argument(
        "--image-cache-bytes",
        type=int,
        default=env("NODEAGENT_IMAGE_CACHE_BYTES") or None,
        help="disk budget for the images this agent pulled: over it, the least recently used are removed, never one "
        "in use or needed by an upcoming launch (NODEAGENT_IMAGE_CACHE_BYTES; default none: nothing is removed)",
    )
    run.add_argument(
        "--pull-timeout-s",
        type=float,
        default=env("NODEAGENT_PULL_TIMEOUT_S") or 3600.0,
        help="the longest one image pull may take before it is abandoned (NODEAGENT_PULL_TIMEOUT_S, default 3600)",
    )
    run.add_argument(
        "--no-listen",
        action="store_true",
        help="no command listener: launches then wait for the next heartbeat instead of being pushed",
    )
    run.add_argument(
        "--no-live-logs",
        action="store_true",
        help="do not ship the containers' output as it comes (with --runtime docker it is shipped by default)",
    )
    run.add_argument(
        "--ssh-listen",
        metavar="HOST:PORT",
        default=env("NODEAGENT_SSH_LISTEN") or "0.0.0.0:2222",
        help="where the SSH gateway listens for tenants (ssh <reservation>@<node>); needs --runtime docker "
        "(NODEAGENT_SSH_LISTEN, default 0.0.0.0:2222)",
    )
    run.add_argument(
        "--ssh-address",
        metavar="HOST",
        default=env("NODEAGENT_SSH_ADDRESS"),
        help="the name or address tenants connect to, as reported to the control plane (NODEAGENT_SSH_ADDRESS, "
        "default the hostname)",
    )
    run.add_argument("--no-ssh", action="store_true", help="no SSH gateway")
    run.add_argument(
        "--journal-max-bytes",
        type=int,
        default=env("NODEAGENT_JOURNAL_MAX_BYTES") or DEFAULT_JOURNAL_MAX_BYTES,
        help="the most the journal of unsent reports may hold in the state directory while the control plane "
        "cannot answer; over it the oldest GPU samples go first, then events, never container starts and exits "
        "(NODEAGENT_JOURNAL_MAX_BYTES, default 64 MiB)",
    )
    run.add_argument(
        "--container-scope",
        metavar="NAME",
        default=env("NODEAGENT_CONTAINER_SCOPE"),
        help="when agents of several control planes share one Docker engine (simulated fleets on one host), a "
        "name that keeps their containers apart: this agent owns only the containers labelled "
        "<NAME>/<hostname> (NODEAGENT_CONTAINER_SCOPE; default none: the label is the hostname)",
    )
    return parser


def container_owner(hostname: str, scope: str | None) -> str:
    """The ``gpucp.node`` label value of the containers this agent owns (and may stop or remove)."""
    return f"{scope}/{hostname}" if scope else hostname


def parse_listen(value: str, *, flag: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as a bind address; ValueError naming the problem otherwise."""
    host, sep, port = value.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{flag} must be HOST:PORT, got {value!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"{flag} port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"{flag} port must be between 0 and 65535, got {number}")
    return host, number


def cmd_probe(args: argparse.Namespace) -> int:
    from nodeagent.probe import probe, render_table

    hostname = args.hostname or socket.gethostname()
    try:
        backend = make_backend(args.simulate, hostname=hostname, kind=args.backend)
    except SimulatedSpecError as exc:
        print(f"nodeagent: {exc}", file=sys.stderr)
        return 2
    except BackendUnavailable as exc:
        print(f"nodeagent: {exc}", file=sys.stderr)
        return 2
    try:
        report = probe(backend, host=HostCollector(hostname=hostname), now=datetime.now(UTC))
    finally:
        backend.close()
    print(report.model_dump_json(indent=2) if args.json else render_table(report))
    return 0


def make_runtime(
    kind: str,
    *,
    state_dir: str,
    hostname: str,
    numa_cpus: dict[str, str],
    gpu_numa: Callable[[str], int | None],
    volumes: VolumeStore | None = None,
    gpu_info: Callable[[str], GpuInfo | None] | None = None,
    registry_mirrors: dict[str, str] | None = None,
    image_cache_bytes: int | None = None,
    pull_timeout_s: float | None = None,
) -> ContainerRuntime:
    if kind == "none":
        return NullRuntime()
    if importlib.util.find_spec("nodeagent.runtime.docker") is None:
        raise BackendUnavailable("the Docker runtime is not part of this agent build; use --runtime none")
    from nodeagent.runtime.docker import DockerRuntime

    try:
        return DockerRuntime(
            state_dir=state_dir,
            node=hostname,
            numa_cpus=numa_cpus,
            gpu_numa=gpu_numa,
            volumes=volumes,
            gpu_info=gpu_info,
            registry_mirrors=registry_mirrors,
            image_cache_bytes=image_cache_bytes,
            **({"pull_timeout_s": pull_timeout_s} if pull_timeout_s is not None else {}),
        )
    except Exception as exc:  # docker.errors.DockerException and friends: say it plainly
        raise BackendUnavailable(f"cannot reach the Docker engine ({exc}); use --runtime none") from exc


def start_log_shipper(
    args: argparse.Namespace,
    runtime: ContainerRuntime,
    node: str,
    credential: Callable[[], str | None],
    journal: Journal | None = None,
) -> LogShipper | None:
    """Live logs (nodeagent.logship) for a Docker runtime, unless --no-live-logs; its own HTTP session, and the
    agent's journal for what waits to be sent."""
    docker_client = getattr(runtime, "client", None)
    if args.runtime != "docker" or args.no_live_logs or docker_client is None:
        return None
    from nodeagent.client import ControlPlaneClient
    from nodeagent.logship import LogShipper

    return LogShipper(
        client=ControlPlaneClient(args.server),
        credential=credential,
        docker_client=docker_client,
        node=node,
        journal=journal,
    ).start()


def cmd_run(args: argparse.Namespace) -> int:
    from nodeagent.agent import Agent, AgentState, AgentStopped
    from nodeagent.client import ControlPlaneClient
    from nodeagent.commands import CommandChannel

    if not args.server:
        print("nodeagent: --server (or NODEAGENT_SERVER) is required", file=sys.stderr)
        return 2
    for flag, value in (("--interval", args.interval), ("--sample-interval", args.sample_interval)):
        if value <= 0:
            print(f"nodeagent: {flag} must be a positive number of seconds, got {value}", file=sys.stderr)
            return 2
    if args.journal_max_bytes < 1024 * 1024:
        print(f"nodeagent: --journal-max-bytes must be at least 1 MiB, got {args.journal_max_bytes}", file=sys.stderr)
        return 2
    bind: tuple[str, int] | None = None
    if not args.no_listen:
        try:
            bind = parse_listen(args.listen)
        except ValueError as exc:
            print(f"nodeagent: {exc}", file=sys.stderr)
            return 2
    ssh_bind: tuple[str, int] | None = None
    if not args.no_ssh:
        try:
            ssh_bind = parse_listen(args.ssh_listen, flag="--ssh-listen")
        except ValueError as exc:
            print(f"nodeagent: {exc}", file=sys.stderr)
            return 2
    mirrors: dict[str, str] = {}
    try:
        for item in args.registry_mirror:
            from nodeagent.runtime.images import parse_mirror

            origin, mirror = parse_mirror(item)
            mirrors[origin] = mirror
    except ValueError as exc:
        print(f"nodeagent: --registry-mirror: {exc}", file=sys.stderr)
        return 2
    if args.image_cache_bytes is not None and int(args.image_cache_bytes) < 0:
        print(f"nodeagent: --image-cache-bytes must be 0 or more, got {args.image_cache_bytes}", file=sys.stderr)
        return 2
    if float(args.pull_timeout_s) <= 0:
        print(
            f"nodeagent: --pull-timeout-s must be a positive number of seconds, got {args.pull_timeout_s}",
            file=sys.stderr,
        )
        return 2
    hostname = args.hostname or socket.gethostname()
    owner = container_owner(hostname, args.container_scope)
    host = HostCollector(hostname=hostname)
    gpu_numa: dict[str, int | None] = {}
    gpu_info: dict[str, GpuInfo] = {}
    volumes: VolumeStore | None = None
    try:
        client = ControlPlaneClient(args.server)
        # Only a container runtime mounts volumes; without one the node does not offer them.
        if args.volume_root and args.runtime == "docker":
            volumes = VolumeStore(
                args.volume_root, dataset_root=args.dataset_root, measure_interval_s=args.volume_measure_s
            )
        runtime = make_runtime(
            args.runtime,
            state_dir=args.state_dir,
            hostname=owner,
            numa_cpus=host.collect().numa_cpus,
            gpu_numa=lambda uuid: gpu_numa.get(uuid),
            volumes=volumes,
            gpu_info=lambda uuid: gpu_info.get(uuid),
            registry_mirrors=mirrors,
            image_cache_bytes=None if args.image_cache_bytes is None else int(args.image_cache_bytes),
            pull_timeout_s=float(args.pull_timeout_s),
        )
        backend = make_backend(args.simulate, hostname=hostname, busy_source=runtime.busy_gpus, kind=args.backend)
    except (ValueError, BackendUnavailable) as exc:
        print(f"nodeagent: {exc}", file=sys.stderr)
        return 2
    for gpu in backend.discover():
        # A MIG device sits where its GPU does; it is NVIDIA's, given by its own uuid.
        for uuid in [gpu.uuid, *(d.uuid for d in (gpu.mig.devices if gpu.mig else []))]:
            gpu_numa[uuid] = gpu.numa_node
            if not backend.simulated:  # simulated AMD GPUs have no render nodes to pass
                gpu_info[uuid] = GpuInfo(vendor=gpu.vendor, pci_bus_id=gpu.pci_bus_id)
    if volumes is not None:
        volumes.start()
    # The listener only verifies against what the agent knows (its credential and server name), so it reads
    # them from the agent once that exists; until enrollment it answers 503.
    holder: dict[str, Agent] = {}
    channel: CommandChannel | None = None
    if bind is not None:
        channel = CommandChannel(
            credential=lambda: holder["agent"].credential if holder else None,
            server_name=lambda: holder["agent"].server_name if holder else None,
            bind=bind,
            # A wildcard bind is reachable by name, not at 0.0.0.0.
            advertise_host=hostname if bind[0] in ("", "0.0.0.0", "::") else None,  # noqa: S104
        )
        try:
            channel.start()
        except OSError as exc:
            backend.close()
            print(f"nodeagent: cannot listen for commands on {args.listen}: {exc}", file=sys.stderr)
            return 2
    gateway = None
    if ssh_bind is not None and args.runtime != "docker":
        log.info("SSH gateway off: its sessions run in the reservation's container, which needs --runtime docker")
    elif ssh_bind is not None:
        from nodeagent.gateway import SshGateway

        gateway = SshGateway(
            state_dir=args.state_dir,
            node=owner,
            bind=ssh_bind,
            address=args.ssh_address or hostname,
            # Nobody can log in before the agent's first converge, so the agent exists by the first event.
            on_session=lambda event: holder["agent"].post_event(event) if holder else None,
        )
        try:
            gateway.start()
        except Exception as exc:  # a port in use, an unreadable host key, no Docker engine
            backend.close()
            if channel is not None:
                channel.close()
            print(f"nodeagent: cannot start the SSH gateway on {args.ssh_listen}: {exc}", file=sys.stderr)
            return 2
    shipper: LogShipper | None = None
    try:
        agent = Agent(
            client=client,
            backend=backend,
            runtime=runtime,
            state=AgentState(args.state_dir),
            buffer=Journal(Path(args.state_dir) / "journal", max_bytes=args.journal_max_bytes),
            host=host,
            join_token=args.join_token,
            interval=args.interval,
            sample_interval=args.sample_interval,
            commands=channel,
            volumes=volumes,
            gateway=gateway,
        )
        holder["agent"] = agent
        shipper = start_log_shipper(args, runtime, owner, lambda: holder["agent"].credential, journal=agent.buffer)
        agent.run()
    except AgentStopped as exc:
        backend.close()
        print(f"nodeagent: {exc}", file=sys.stderr)
        return exc.exit_code
    finally:
        if shipper is not None:
            shipper.stop()
        if channel is not None:
            channel.close()
        if volumes is not None:
            volumes.close()
        if gateway is not None:
            gateway.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return cmd_probe(args) if args.command == "probe" else cmd_run(args)


if __name__ == "__main__":
    sys.exit(main())
