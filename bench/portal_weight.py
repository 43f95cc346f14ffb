"""The portal's weight: bytes transferred on a first load (fresh cache) of each page, signed out and signed in.

    .venv/bin/python bench/portal_weight.py [--url http://127.0.0.1:8000 --tenant-password ... --operator-password ...]
                                            [--no-build] [--json out.json]

Without ``--url`` it builds the portal (``npm run build``, unless ``--no-build``) and starts a throwaway demo
system of its own (``manage.py runsystem --no-frontend`` on SQLite, as tests/e2e/test_portal.py does). Then
headless Chromium (Debian's, driven by playwright-core from frontend/node_modules; bench/portal_weight.mjs) loads
every page with its cache cleared: signed out (every path lands on the sign-in page), then as the tenant and as
the operator. Bytes are Chromium's count of what crossed the wire (headers and bodies, compressed as served).
The baseline, in the same run, is each page loaded again with compression refused (``Accept-Encoding:
identity``): the uncompressed total. Goal: the sign-in page and the dashboard under 200 KB transferred.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, free_port

GOAL_BYTES = 200_000
GOAL_PAGES = ("login", "dashboard")
TENANT_PASSWORD = "alice-bench-password"
OPERATOR_PASSWORD = "operator-bench-password"
# name, path, who sees it signed in
PAGES = [
    ("login", "/login", "tenant"),
    ("dashboard", "/", "tenant"),
    ("availability", "/availability", "tenant"),
    ("queue", "/queue", "tenant"),
    ("usage", "/usage", "tenant"),
    ("volumes", "/volumes", "tenant"),
    ("tokens", "/tokens", "tenant"),
    ("ssh-keys", "/ssh-keys", "tenant"),
    ("fleet", "/fleet", "operator"),
    ("join-tokens", "/join-tokens", "operator"),
    ("operator-queue", "/operator-queue", "operator"),
]


def start_system(var: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A demo system of its own on SQLite; returns once the portal answers and the operator can see servers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.update(
        CONTROLPLANE_VAR_DIR=str(var),
        DEMO_TENANT_PASSWORD=TENANT_PASSWORD,
        DEMO_OPERATOR_PASSWORD=OPERATOR_PASSWORD,
        PYTHONUNBUFFERED="1",
    )
    log = (var / "runsystem.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runsystem", "--no-frontend", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"runsystem exited with {proc.returncode}; see {var / 'runsystem.log'}")
        try:
            with urllib.request.urlopen(f"{base}/api/v1/auth/csrf/", timeout=2) as r:  # noqa: S310 - our own URL
                if r.status == 200:
                    with urllib.request.urlopen(f"{base}/login", timeout=2) as p:  # noqa: S310
                        if p.status == 200:
                            return proc, base
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("the system did not come up in 180 s")


def stop_system(proc: subprocess.Popen[bytes]) -> None:
    # runsystem leads its own process group (web, worker, beat, agents): stop that group only.
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def measure(base: str, tenant_password: str, operator_password: str) -> list[dict[str, Any]]:
    env = dict(
        os.environ,
        PORTAL_URL=base,
        TENANT_PASSWORD=tenant_password,
        OPERATOR_PASSWORD=operator_password,
        PAGES=json.dumps([{"name": n, "path": p, "as": who} for n, p, who in PAGES]),
    )
    done = subprocess.run(
        ["node", str(Path(__file__).with_name("portal_weight.mjs"))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"the browser run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def report(loads: list[dict[str, Any]]) -> bool:
    kb = lambda n: f"{n / 1000:8.1f}"  # noqa: E731
    served = {(x["page"], x["as"]): x for x in loads if x["encoding"] != "identity"}
    identity = {(x["page"], x["as"]): x for x in loads if x["encoding"] == "identity"}
    print(f"{'page':<16}{'as':<12}{'requests':>9}{'KB served':>11}{'of it API':>11}{'KB identity':>13}{'ratio':>7}")
    ok = True
    for key, x in served.items():
        base = identity[key]
        ratio = x["bytes"] / base["bytes"] if base["bytes"] else float("nan")
        print(
            f"{x['page']:<16}{x['as']:<12}{x['requests']:>9}{kb(x['bytes']):>11}{kb(x['api_bytes']):>11}"
            f"{kb(base['bytes']):>13}{ratio:>7.2f}"
        )
    for page in GOAL_PAGES:
        as_ = "signed-out" if page == "login" else "tenant"
        got = served[(page, as_)]["bytes"]
        passed = got < GOAL_BYTES
        ok &= passed
        verdict = "PASS" if passed else "FAIL"
        print(f"goal: {page} ({as_}) first load {got / 1000:.1f} KB < {GOAL_BYTES / 1000:.0f} KB: {verdict}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running portal; without it a demo system is started")
    parser.add_argument("--tenant-password", default=TENANT_PASSWORD)
    parser.add_argument("--operator-password", default=OPERATOR_PASSWORD)
    parser.add_argument("--no-build", action="store_true", help="use frontend/dist as it is")
    parser.add_argument("--json", type=Path, help="write every load (with its files) here")
    args = parser.parse_args()
    if not shutil.which("node"):
        raise SystemExit("bench/portal_weight.py needs node (and frontend/node_modules) to drive Chromium")
    proc = None
    try:
        if args.url:
            base = args.url.rstrip("/")
        else:
            if not args.no_build:
                subprocess.run(["npm", "run", "build"], cwd=ROOT / "frontend", check=True, capture_output=True)
            proc, base = start_system(Path(tempfile.mkdtemp(prefix="bench-portal-weight-")))
        loads = measure(base, args.tenant_password, args.operator_password)
    finally:
        if proc is not None:
            stop_system(proc)
    if args.json:
        args.json.write_text(json.dumps(loads, indent=2))
    if not report(loads):
        sys.exit(1)


if __name__ == "__main__":
    main()
