"""``gpucp gpus``, ``book``, ``ls``, ``show``, ``extend``, ``keep`` and ``cancel``: reservations via the API."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from gpucp.client import path
from gpucp.output import emit_json, parse_time, spec_text, table, when
from gpucp.state import State, default_project, pass_state

# The reservation states in which it holds GPUs now or later: what `gpucp ls` shows without --all.
HOLDING_STATES = ("pending", "scheduled", "starting", "running", "ending")
LOG_LINES = 20


def _iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _start(value: str) -> tuple[str, datetime]:
    """(what to send, the instant it means): "now", or an ISO 8601 time, in the local zone if it names none."""
    if value.strip().lower() == "now":
        return "now", datetime.now(UTC)
    try:
        instant = parse_time(value.strip())
    except ValueError:
        raise click.BadParameter(f'{value!r} is neither "now" nor an ISO 8601 time.', param_hint="--start")
    if instant.tzinfo is None:
        instant = instant.astimezone()
    return _iso(instant), instant


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE.", param_hint="--env")
        env[name] = value
    return env


VOLUME_PATH_DEFAULT = "/workspace"


def _volume(value: str) -> dict[str, Any]:
    """``NAME[:PATH][:ro]`` as a booking's mount; the path defaults to /workspace. The API judges the rest."""
    name, *rest = value.split(":")
    read_only = bool(rest) and rest[-1] == "ro"
    if read_only:
        rest.pop()
    if not name or len(rest) > 1:
        raise click.BadParameter(f"{value!r} is not NAME[:PATH][:ro].", param_hint="--volume")
    return {"volume": name, "path": rest[0] if rest else VOLUME_PATH_DEFAULT, "read_only": read_only}


def _dataset(value: str) -> dict[str, Any]:
    """``NAME[:PATH]``; without a path the API mounts it at /datasets/NAME, always read-only."""
    name, sep, where = value.partition(":")
    if not name or (sep and not where):
        raise click.BadParameter(f"{value!r} is not NAME[:PATH].", param_hint="--dataset")
    return {"dataset": name, **({"path": where} if sep else {})}


def _port(value: str) -> dict[str, Any]:
    """``NAME:PORT[:PATH]`` as a booking's named web port (http; the path defaults to /). The API judges the
    name, the port's range and the path."""
    name, _, rest = value.partition(":")
    number, sep, where = rest.partition(":")
    if not name or not number.isdigit() or (sep and not where):
        raise click.BadParameter(f"{value!r} is not NAME:PORT[:PATH] (e.g. jupyter:8888:/lab).", param_hint="--port")
    return {"name": name, "port": int(number), **({"path": where} if sep else {})}


def _default_name(image: str) -> str:
    # registry.example/team/train:1 -> train
    return image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0] or "gpucp"


def _gpus_text(allocations: list[dict[str, Any]]) -> str:
    by_server: dict[str, list[str]] = {}
    for a in allocations:
        by_server.setdefault(a["server"], []).append(str(a["index"]))
    return "; ".join(f"{server} [{', '.join(idx)}]" for server, idx in by_server.items()) or "-"


def _summary(detail: dict[str, Any], state: State) -> None:
    click.echo(f"{detail['id']}  {detail['name']}  ({detail['project']})")
    rows = [
        ["state", detail["state"]],
        ["window", f"{when(detail['starts_at'], utc=state.utc)} -> {when(detail['ends_at'], utc=state.utc)}"],
        ["gpus", f"{spec_text(detail['spec'])}: {_gpus_text(detail.get('allocations', []))}"],
        ["image", detail["image"]],
    ]
    if detail.get("template"):
        rows.append(["template", str(detail["template"])])
    if detail.get("command"):
        rows.append(["command", " ".join(detail["command"])])
    if detail.get("env"):
        rows.append(["env", " ".join(f"{k}={v}" for k, v in detail["env"].items())])
    for mount in detail.get("volumes") or []:
        mode = "read-only" if mount.get("read_only") else "read-write"
        rows.append([str(mount.get("kind", "volume")), f"{mount.get('name')} at {mount.get('path')} ({mode})"])
    if detail.get("network") and detail["network"] != "none":
        rows.append(["network", str(detail["network"])])
    access = detail.get("access") or {}
    if access.get("ready"):
        rows.extend(["ssh", entry["command"]] for entry in access.get("ssh", []))
    for line in table(["", ""], rows).splitlines()[1:]:
        click.echo("  " + line)


@click.command()
@click.option("--model", "-m", "models", multiple=True, metavar="MODEL", help="A catalog GPU model (default: all).")
@click.option("--gpus", "count", type=click.IntRange(min=1), default=1, show_default=True, help="How many together.")
@click.option("--hours", type=click.FloatRange(min=0.01), default=1.0, show_default=True, help="For how long.")
@click.option("--within-days", type=click.IntRange(1, 90), default=7, show_default=True, help="How far ahead to look.")
@pass_state
def gpus(state: State, models: tuple[str, ...], count: int, hours: float, within_days: int) -> None:
    """What is free now and soon, per GPU model.

    Per model: the GPUs free from now for HOURS, and the earliest start of a booking of GPUS x HOURS.
    """
    api = state.api()
    catalog = {m["name"]: m for m in api.get(path("gpu-models"), {"limit": 500})["results"]}
    # A name the catalog lacks is still asked about: the API's answer says what is wrong with it.
    chosen = [catalog.get(name, {"name": name}) for name in models] if models else list(catalog.values())
    duration = f"{hours:.3f}"  # the API keeps three decimals
    end = datetime.now(UTC) + timedelta(hours=float(duration))
    answers = []
    for model in chosen:
        spec = {"gpu_model": model["name"], "gpu_count": count}
        free = api.get(path("availability", "free"), {**spec, "start": "now", "end": _iso(end)})
        earliest = api.get(
            path("availability", "earliest"), {**spec, "duration_hours": duration, "within_days": within_days}
        )
        answers.append({"gpu_model": model, "free": free, "earliest": earliest})
    if state.json:
        emit_json(answers)
        return
    rows = []
    for a in answers:
        model, free, earliest = a["gpu_model"], a["free"], a["earliest"]
        price = (
            f"{model['price_per_gpu_hour']} {model.get('currency', '')}".strip()
            if "price_per_gpu_hour" in model
            else "-"
        )
        memory = f"{model['memory_mib'] / 1024:.0f} GiB" if "memory_mib" in model else "-"
        servers = sum(1 for s in free["servers"] if s["free"])
        if not earliest["found"]:
            soonest = f"none within {within_days} days"
        elif parse_time(earliest["start"]) <= datetime.now(UTC) + timedelta(minutes=1):
            soonest = "now"
        else:
            soonest = when(earliest["start"], utc=state.utc)
        rows.append([model["name"], memory, price, free["free_gpus"], servers, soonest])
    click.echo(
        f"Free from now for {duration.rstrip('0').rstrip('.')} h; earliest start for {count} GPU(s) on one booking:"
    )
    click.echo(table(["MODEL", "MEMORY", "PER GPU-HOUR", "FREE NOW", "SERVERS", "EARLIEST"], rows, right=[3, 4]))


@click.command()
@click.option(
    "--template",
    "-t",
    metavar="NAME",
    help="A launch template (`GET /api/v1/templates/`): its image, command, env, GPU spec and window length "
    "fill what the other options leave out; those given override it.",
)
@click.option("--gpus", "count", type=click.IntRange(min=1), default=None, help="How many GPUs  [default: 1].")
@click.option("--model", "-m", help="The catalog GPU model, e.g. H100-80GB (required without --template).")
@click.option(
    "--hours",
    type=click.FloatRange(min=0, min_open=True),
    help="The window's length (required without --template, whose length is the default).",
)
@click.option("--image", help="The container image to run (required without --template).")
@click.option("--project", "-p", help="The project's slug (default: your only project).")
@click.option("--name", help="A name for the reservation (default: from the image).")
@click.option("--start", default="now", show_default=True, help='"now" or an ISO 8601 time (local zone if none given).')
@click.option("--env", "-e", "env", multiple=True, metavar="KEY=VALUE", help="An environment variable; repeatable.")
@click.option(
    "--volume",
    "volume_args",
    multiple=True,
    metavar="NAME[:PATH][:ro]",
    help="Mount a volume of the project (default path /workspace; :ro read-only); repeatable.",
)
@click.option(
    "--dataset",
    "dataset_args",
    multiple=True,
    metavar="NAME[:PATH]",
    help="Mount a dataset read-only (default path /datasets/NAME); repeatable.",
)
@click.option(
    "--port",
    "port_args",
    multiple=True,
    metavar="NAME:PORT[:PATH]",
    help="A web app the container serves on PORT, opened by `gpucp open ID NAME` at PATH (default /); repeatable.",
)
@click.option(
    "--network",
    type=click.Choice(["none", "egress"]),
    default=None,
    help="egress: reach the outside on the project's network, if an operator allowed it (default none).",
)
@click.option(
    "--idempotency-key",
    metavar="KEY",
    help="Sent with the booking (default: a fresh one). The same key and the same request book once: "
    "reuse it with the same --start time to retry a booking whose answer was lost.",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@pass_state
def book(
    state: State,
    template: str | None,
    count: int | None,
    model: str | None,
    hours: float | None,
    image: str | None,
    project: str | None,
    name: str | None,
    start: str,
    env: tuple[str, ...],
    volume_args: tuple[str, ...],
    dataset_args: tuple[str, ...],
    port_args: tuple[str, ...],
    network: str | None,
    idempotency_key: str | None,
    command: tuple[str, ...],
) -> None:
    """Book GPUs and run a container on them.

    The window starts at --start and lasts --hours; IMAGE runs on exactly the booked GPUs, with the command
    given after `--`:

    \b
    gpucp book --gpus 2 --model H100-80GB --hours 4 --image registry.example/train:1 -- python train.py

    From a launch template, overriding what it gives:

    \b
    gpucp book --template pytorch --gpus 2 -- python train.py
    """
    if template is None:
        missing = [f"--{name}" for name, value in (("model", model), ("hours", hours), ("image", image)) if not value]
        if missing:
            raise click.UsageError(f"Give {', '.join(missing)}, or --template NAME.")
    sent_start, _ = _start(start)
    variables = _env(env)
    mounts = [*(_volume(v) for v in volume_args), *(_dataset(d) for d in dataset_args)]
    ports = [_port(p) for p in port_args]
    api = state.api()
    if template is not None:
        body = _template_body(
            template,
            project=default_project(api, project),
            name=name,
            count=count,
            model=model,
            hours=hours,
            image=image,
            start=sent_start,
            command=list(command),
            env=variables,
            mounts=mounts,
            ports=ports,
            network=network,
        )
        detail = api.post(path("reservations"), body, key=idempotency_key or str(uuid.uuid4()))
        _booked(detail, state)
        return
    assert model is not None and hours is not None and image is not None
    count = count or 1
    body = {
        "project": default_project(api, project),
        "name": name or _default_name(image),
        "spec": {"gpu_model": model, "gpu_count": count},
        # A duration, not an end: `--start now` then sends the same body on every run, so a run again with the
        # same --idempotency-key replays the first booking instead of being refused as another request.
        "window": {"start": sent_start, "duration": max(1, round(hours * 3600))},
        "container": {
            "image": image,
            "command": list(command),
            "env": variables,
            # Sent only when asked for: a plain booking's body stays as it was.
            **({"volumes": mounts} if mounts else {}),
            **({"ports": ports} if ports else {}),
            **({"network": network} if network else {}),
        },
    }
    # One key for every attempt of this booking: a retry after a lost answer replays it, never books twice.
    detail = api.post(path("reservations"), body, key=idempotency_key or str(uuid.uuid4()))
    _booked(detail, state)


def _booked(detail: dict[str, Any], state: State) -> None:
    if state.json:
        emit_json(detail)
        return
    click.echo("Booked:")
    _summary(detail, state)
    click.echo(f"`gpucp show {detail['id']}` follows it.")


def _template_body(
    template: str,
    *,
    project: str,
    name: str | None,
    count: int | None,
    model: str | None,
    hours: float | None,
    image: str | None,
    start: str,
    command: list[str],
    env: dict[str, str],
    mounts: list[dict[str, Any]],
    ports: list[dict[str, Any]],
    network: str | None,
) -> dict[str, Any]:
    """A booking from a template: only what the options give is sent, the API fills in the template's."""
    spec = {**({"gpu_model": model} if model else {}), **({"gpu_count": count} if count else {})}
    window: dict[str, Any] = {"start": start}
    if hours:
        window["duration"] = max(1, round(hours * 3600))
    container = {
        **({"image": image} if image else {}),
        **({"command": command} if command else {}),
        **({"env": env} if env else {}),
        **({"volumes": mounts} if mounts else {}),
        # Given, they replace the template's ports; left out, the booking gets the template's.
        **({"ports": ports} if ports else {}),
        **({"network": network} if network else {}),
    }
    return {
        "project": project,
        "name": name or (_default_name(image) if image else template),
        "template": template,
        **({"spec": spec} if spec else {}),
        "window": window,
        **({"container": container} if container else {}),
    }


@click.command(name="ls")
@click.option("--all", "show_all", is_flag=True, help="Every state, finished ones too.")
@click.option("--project", "-p", help="Only this project (slug).")
@click.option("--state", "-s", "states", multiple=True, metavar="STATE", help="Only this state; repeatable.")
@click.option(
    "--limit", type=click.IntRange(1, 500), default=50, show_default=True, help="At most this many, newest first."
)
@pass_state
def list_reservations(state: State, show_all: bool, project: str | None, states: tuple[str, ...], limit: int) -> None:
    """List reservations.

    Your projects' reservations, newest first: by default those holding GPUs now or later.
    """
    api = state.api()
    params: dict[str, Any] = {"limit": limit}
    if project:
        params["project"] = project
    if states or not show_all:
        params["state"] = list(states or HOLDING_STATES)
    page = api.get(path("reservations"), params)
    if state.json:
        emit_json(page)
        return
    rows = [
        [
            r["id"],
            r["name"],
            r["project"],
            r["state"],
            spec_text(r["spec"]),
            when(r["starts_at"], utc=state.utc),
            when(r["ends_at"], utc=state.utc),
        ]
        for r in page["results"]
    ]
    if not rows:
        click.echo(
            "No reservations." if show_all or states else "No reservations holding GPUs (--all shows every one)."
        )
        return
    click.echo(table(["ID", "NAME", "PROJECT", "STATE", "GPUS", "START", "END"], rows))
    if page["count"] > len(rows):
        click.echo(f"({len(rows)} of {page['count']}; --limit shows more)", err=True)


@click.command()
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@pass_state
def show(state: State, reservation_id: uuid.UUID) -> None:
    """Show one reservation.

    Its state, window, GPUs, events, and its containers (state, exit code, log tail).
    """
    api = state.api()
    detail = api.get(path("reservations", reservation_id))
    launches = api.get(path("reservations", reservation_id, "launches"), {"limit": 500})["results"]
    if state.json:
        emit_json({"reservation": detail, "launches": launches})
        return
    _summary(detail, state)
    allocations = detail.get("allocations", [])
    if allocations:
        click.echo("\nGPUs:")
        click.echo(
            table(
                ["SERVER", "INDEX", "GPU", "MODEL", "HELD UNTIL"],
                [
                    [
                        a["server"],
                        a["index"],
                        a["gpu"],
                        a["gpu_model"],
                        when(a["released_at"] or a["ends_at"], utc=state.utc),
                    ]
                    for a in allocations
                ],
                right=[1],
            )
        )
    _ports(detail)
    click.echo("\nEvents:")
    click.echo(
        table(
            ["AT", "FROM", "TO", "BY", "REASON"],
            [
                [
                    when(e["at"], utc=state.utc, seconds=True),
                    e["from_state"] or "-",
                    e["to_state"],
                    e["actor_label"],
                    e["reason"],
                ]
                for e in detail.get("events", [])
            ],
        )
    )
    if launches:
        click.echo("\nContainers:")
        click.echo(
            table(
                ["SERVER", "GEN", "STATE", "EXIT", "STARTED", "FINISHED", "ERROR"],
                [
                    [
                        launch["server"],
                        launch["generation"],
                        launch["state"],
                        "-" if launch["exit_code"] is None else launch["exit_code"],
                        when(launch["started_at"], utc=state.utc, seconds=True),
                        when(launch["finished_at"], utc=state.utc, seconds=True),
                        launch["error"] or "",
                    ]
                    for launch in launches
                ],
                right=[1, 3],
            )
        )
        tail = (launches[-1].get("log_tail") or "").splitlines()[-LOG_LINES:]
        if tail:
            click.echo(f"\nLog of the last container (its last {len(tail)} lines):")
            for line in tail:
                click.echo("  " + line)


def _ports(detail: dict[str, Any]) -> None:
    """The named ports; while the container runs, each web app's stable address (``access.web``)."""
    ports = detail.get("ports") or []
    if not ports:
        return
    urls = {app["name"]: app["url"] for app in (detail.get("access") or {}).get("web") or []}
    click.echo("\nPorts:")
    click.echo(
        table(
            ["NAME", "PORT", "PROTOCOL", "PATH", "URL"],
            [[p["name"], p["port"], p["protocol"], p.get("path", "/"), urls.get(p["name"], "-")] for p in ports],
            right=[1],
        )
    )
    if urls:
        click.echo(f"`gpucp open {detail['id']} NAME` signs the browser in to an app (a one-time link).")


@click.command()
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@click.option("--hours", type=click.FloatRange(min=0, min_open=True), required=True, help="How much longer.")
@click.option("--reason", default="", help="Kept with the reservation's event.")
@pass_state
def extend(state: State, reservation_id: uuid.UUID, hours: float, reason: str) -> None:
    """Make a reservation longer.

    The window ends HOURS later, on the same GPUs, if they are free and the quota allows it.
    """
    api = state.api()
    current = api.get(path("reservations", reservation_id))
    ends_at = parse_time(current["ends_at"]) + timedelta(hours=hours)
    detail = api.post(path("reservations", reservation_id, "extend"), {"ends_at": _iso(ends_at), "reason": reason})
    if state.json:
        emit_json(detail)
        return
    click.echo(f"Extended to {when(detail['ends_at'], utc=state.utc)}:")
    _summary(detail, state)


@click.command()
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@pass_state
def keep(state: State, reservation_id: uuid.UUID) -> None:
    """Keep a reservation an idle warning cut short.

    Its booked end comes back (if nobody booked the freed GPUs meanwhile), and it is not reclaimed again.
    """
    api = state.api()
    detail = api.post(path("reservations", reservation_id, "keep"), {})
    if state.json:
        emit_json(detail)
        return
    click.echo(f"Kept {detail['id']}: it runs to {when(detail['ends_at'], utc=state.utc)} again.")


@click.command()
@click.argument("reservation_id", metavar="ID", type=click.UUID)
@click.option("--reason", default="", help="Kept with the reservation's event.")
@pass_state
def cancel(state: State, reservation_id: uuid.UUID, reason: str) -> None:
    """Cancel a reservation.

    Before its window, its GPUs and held credits are released; during it, the window ends now.
    """
    api = state.api()
    detail = api.post(path("reservations", reservation_id, "cancel"), {"reason": reason})
    if state.json:
        emit_json(detail)
        return
    if detail["state"] == "cancelled":
        click.echo(f"Cancelled {detail['id']}: its GPUs and held credits are released.")
    else:
        click.echo(f"Ended {detail['id']} now ({detail['state']}): its container is being stopped.")
