"""The apps under controlplane/ form layers: each pair of apps depends one way only, and core imports no app.

Every import counts, at module level and inside functions (a deferred import is still a dependency, only one
that hides from the import-time check), ``import x`` and ``from x import y`` alike, relative ones resolved.
Migrations count too: they import their own app (and, rarely, a lower one) like any module. The composition
root (controlplane/settings.py, urls.py, celery.py, wsgi.py) may import anything; no app may import it (an app
reads settings through ``django.conf.settings``, never ``controlplane.settings``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import django
from django.apps import apps as django_apps

ROOT = Path(__file__).resolve().parent.parent / "controlplane"
PACKAGE = "controlplane"
# The top-level modules that wire the apps together (Django and Celery entry points).
COMPOSITION_ROOT = frozenset({"settings", "urls", "celery", "wsgi", "asgi", "__init__"})


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> Iterator[str]:
    """Every module ``path`` imports, anywhere in its body, as an absolute dotted name."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return imports_in(path.read_text(), package=package, filename=str(path))


def imports_in(source: str, *, package: str, filename: str = "<source>") -> Iterator[str]:
    """The modules ``source`` imports; ``package`` is the one its relative imports start from."""
    tree = ast.parse(source, filename=filename)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: -(node.level - 1)]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            yield target
            # ``from controlplane import fleet`` names the app in the alias, not the module.
            if target == PACKAGE:
                for alias in node.names:
                    yield f"{PACKAGE}.{alias.name}"


def unit_of(module: str) -> str | None:
    """The app (or composition-root module) ``module`` belongs to; None outside controlplane."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return parts[1]


def app_names() -> set[str]:
    return {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def import_graph() -> dict[str, dict[str, list[str]]]:
    """app -> imported app -> the modules (``where -> what``) that make the edge."""
    apps = app_names()
    graph: dict[str, dict[str, list[str]]] = {app: {} for app in apps}
    for path in sorted(ROOT.rglob("*.py")):
        source = unit_of(module_name(path)) if path.name != "__init__.py" or path.parent != ROOT else None
        if source not in apps:
            continue
        for target_module in imported_modules(path):
            target = unit_of(target_module)
            if target is None or target == source:
                continue
            graph[source].setdefault(target, []).append(f"{module_name(path)} -> {target_module}")
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one member: each is a set of apps that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe(graph: dict[str, dict[str, list[str]]]) -> str:
    lines = ["The app import graph (app -> the apps it imports):"]
    for app in sorted(graph):
        lines.append(f"  {app} -> {', '.join(sorted(graph[app])) or '(none)'}")
    return "\n".join(lines)


def app_edges(graph: dict[str, dict[str, list[str]]]) -> dict[str, set[str]]:
    apps = app_names()
    return {app: {t for t in targets if t in apps} for app, targets in graph.items()}


def test_the_walker_sees_function_level_and_relative_imports() -> None:
    # The graph is only as good as the walker: a deferred or relative import must show up as an edge.
    source = (
        "from . import models\n"
        "from ..core import errors\n"
        "from controlplane import ledger\n"
        "\n"
        "def f():\n"
        "    import controlplane.dispatch.hooks\n"
        "    from controlplane.fleet.services import x\n"
    )
    found = set(imports_in(source, package="controlplane.inventory"))
    assert {unit_of(name) for name in found} - {None} == {"inventory", "core", "ledger", "dispatch", "fleet"}
    assert "controlplane.dispatch.hooks" in found
    assert app_edges(import_graph()), "no apps found under controlplane/"


def test_no_two_apps_import_each_other() -> None:
    graph = import_graph()
    edges = app_edges(graph)
    pairs = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))
    cycles = strongly_connected(edges)
    if pairs or cycles:
        detail = []
        for a, b in pairs:
            detail.append(f"  {a} <-> {b}:")
            detail.extend(f"      {line}" for line in graph[a][b] + graph[b][a])
        message = (
            f"apps that import each other: {', '.join(f'{a}<->{b}' for a, b in pairs) or '(no pair)'}\n"
            f"import circles (strongly connected groups): {cycles}\n"
            + "\n".join(detail)
            + "\n"
            + describe(graph)
            + "\nA lower app tells a higher one through a hook it registers in AppConfig.ready()"
            " (docs/design-notes.md, Layers)."
        )
        raise AssertionError(message)


def test_core_imports_no_other_app() -> None:
    graph = import_graph()
    upward = {target: where for target, where in graph["core"].items()}
    assert not upward, (
        f"core imports {sorted(upward)}:\n"
        + "\n".join(f"  {line}" for lines in upward.values() for line in lines)
        + "\n"
        + describe(graph)
    )


def test_no_app_imports_the_composition_root() -> None:
    graph = import_graph()
    offenders = {
        app: {target: lines for target, lines in targets.items() if target in COMPOSITION_ROOT}
        for app, targets in graph.items()
    }
    offenders = {app: t for app, t in offenders.items() if t}
    assert not offenders, (
        "apps importing the composition root (read settings through django.conf instead):\n"
        + "\n".join(f"  {line}" for t in offenders.values() for lines in t.values() for line in lines)
    )


def test_every_required_hook_is_registered_once_django_is_set_up() -> None:
    # Tests run with every app installed, which would hide a hook that only worked because a test filled it:
    # after setup (every ready() run) and the URLconf (every API module imported), none may be left empty.
    django.setup()
    import controlplane.urls  # noqa: F401
    from controlplane.core.hooks import declared_hooks

    hooks = {hook.name: hook for hook in declared_hooks()}
    assert {
        "reservations.booked",
        "reservations.changed",
        "fleet.desired_state_for",
        "fleet.work_probe",
        "fleet.containers_reported",
        "fleet.server_lost",
        "inventory.server_retired",
        "ledger.member_gpu_hours",
    } <= set(hooks)
    empty = sorted(name for name, hook in hooks.items() if not hook.registered)
    assert not empty, f"required hooks nobody registered: {empty}"


def test_every_app_is_installed() -> None:
    # An app on disk but not in INSTALLED_APPS would never run its ready(), and so never register its hooks.
    django.setup()
    installed = {config.name for config in django_apps.get_app_configs()}
    missing = {f"{PACKAGE}.{app}" for app in app_names()} - installed
    assert not missing, f"not in INSTALLED_APPS: {sorted(missing)}"
