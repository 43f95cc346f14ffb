"""The portal end to end: a real system (``manage.py runsystem``) driven through headless Chromium.

The browser scripts are tests/e2e/portal.e2e.mjs and the others beside it (playwright-core with Debian's chromium;
no browser download), all against one system (the ``running_system`` fixture, portal_support.py). Without chromium
or npm the tests skip on a developer's machine and fail under CI=true.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.e2e.portal_support import ARTIFACTS, FRONTEND, OWN_DRIVERS, npm_ci_if_needed, run_command, run_script

SCRIPT = Path(__file__).with_name("portal.e2e.mjs")

pytestmark = pytest.mark.slow


def _scripts() -> list[Path]:
    """The main walk first, then every other browser script beside it (tests/e2e/*.e2e.mjs), by name."""
    others = sorted(p for p in SCRIPT.parent.glob("*.e2e.mjs") if p != SCRIPT and p.name not in OWN_DRIVERS)
    return [SCRIPT, *others]


def test_tenant_books_watches_and_cancels_and_operator_drains(running_system: str) -> None:
    run_script(SCRIPT, running_system)
    for name in (
        "01-login",
        "02-dashboard",
        "03-availability",
        "05-reservation-running",
        "05b-telemetry-charts",
        "07-usage",
        "10-fleet",
    ):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000, name


@pytest.mark.parametrize("script", _scripts()[1:], ids=lambda p: p.name.removesuffix(".e2e.mjs"))
def test_portal_script(running_system: str, script: Path) -> None:
    """Each further browser script (one per part of the portal) against the same running system."""
    run_script(script, running_system)


def test_portal_unit_tests_pass() -> None:
    """The portal's own logic (Vitest): quota effect, API client, timeline layout, formatting."""
    npm = shutil.which("npm")
    if not npm or not shutil.which("node"):
        service_missing("npm and node (needed to run the portal's unit tests)")
    npm_ci_if_needed(npm)  # type: ignore[arg-type]
    run_command([npm, "test"], cwd=FRONTEND, timeout=600)  # type: ignore[list-item]
