"""``gpucp volumes ls``, ``create`` and ``rm``: a project's volumes, through ``/api/v1/projects/{slug}/volumes/``."""

from __future__ import annotations

from typing import Any

import click

from gpucp.client import path
from gpucp.output import emit_json, table, when
from gpucp.state import State, default_project, pass_state

GIB = 1024**3
BAR = 10


def _used(volume: dict[str, Any]) -> str:
    """``3.2 GiB [###-------] 32%``, or ``-`` before the first measurement."""
    used, percent = volume.get("used_bytes"), volume.get("used_percent")
    if used is None or percent is None:
        return "-"
    filled = min(BAR, round(float(percent) / 100 * BAR))
    over = " OVER" if volume.get("over_limit") else ""
    return f"{used / GIB:.1f} GiB [{'#' * filled}{'-' * (BAR - filled)}] {percent:.0f}%{over}"


def _line(volume: dict[str, Any]) -> str:
    shared = ", shared" if volume["shared"] else ""
    return f"{volume['name']} ({volume['size_limit_gib']} GiB{shared}) in {volume['project']}"


project_option = click.option("--project", "-p", help="The project's slug (default: your only project).")


@click.group()
def volumes() -> None:
    """Your projects' volumes: directories kept between reservations, mounted with `gpucp book --volume`."""


@volumes.command(name="ls")
@project_option
@pass_state
def list_volumes(state: State, project: str | None) -> None:
    """List a project's volumes, with their size limits and what they held when last measured."""
    api = state.api()
    slug = default_project(api, project)
    page = api.get(path("projects", slug, "volumes"), {"limit": 500})
    if state.json:
        emit_json(page)
        return
    rows = [
        [
            v["name"],
            v["size_limit_gib"],
            _used(v),
            "yes" if v["shared"] else "no",
            when(v.get("measured_at"), utc=state.utc),
        ]
        for v in page["results"]
    ]
    if not rows:
        click.echo(f"Project {slug} has no volumes: `gpucp volumes create NAME --size-gib N` makes one.")
        return
    click.echo(table(["NAME", "LIMIT GIB", "USED", "SHARED", "MEASURED"], rows, right=[1]))


@volumes.command(name="create")
@click.argument("name")
@click.option("--size-gib", type=int, required=True, help="The size limit in GiB; charged per GiB-hour.")
@click.option("--shared", is_flag=True, help="May be mounted by overlapping reservations at once.")
@project_option
@pass_state
def create(state: State, name: str, size_gib: int, shared: bool, project: str | None) -> None:
    """Create the volume NAME (lowercase letters, digits, - and _).

    \b
    gpucp volumes create data --size-gib 100
    gpucp book ... --volume data:/workspace
    """
    api = state.api()
    slug = default_project(api, project)
    volume = api.post(path("projects", slug, "volumes"), {"name": name, "size_limit_gib": size_gib, "shared": shared})
    if state.json:
        emit_json(volume)
        return
    click.echo(f"Created {_line(volume)}")


@volumes.command(name="rm")
@click.argument("name")
@project_option
@pass_state
def remove(state: State, name: str, project: str | None) -> None:
    """Forget the volume NAME. Its data on the storage is not deleted (an operator removes it); a live
    reservation that mounts it must end first."""
    api = state.api()
    slug = default_project(api, project)
    volume = api.get(path("projects", slug, "volumes", name))
    api.request("DELETE", path("projects", slug, "volumes", name))
    if state.json:
        emit_json(volume)
        return
    click.echo(f"Removed {_line(volume)}; its data on disk is left as it was.")
