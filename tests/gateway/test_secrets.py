"""An SSH session runs inside the reservation's container, so it sees the launch's secrets as its container does:
the variables and the files under /run/secrets. Its open and close events never carry a value."""

from __future__ import annotations

import logging

import pytest

from nodeagent import schema

from .conftest import make_spec
from .support import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.faults]

TOKEN = "hf_gateway-secret-for-tests-9d8c7b"


def test_an_ssh_session_sees_the_secrets_as_env_and_as_files(make_world, caplog):  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG)

    def build(clock, keys):  # type: ignore[no-untyped-def]
        secret = schema.SecretValue(name="hf_token", value=TOKEN, env="HF_TOKEN", file=True)
        return {"s": make_spec("s", clock, ssh_keys=[keys["alice"].authorized("alice")], secrets=[secret])}

    world = make_world(build, running=["s"], key_names=("alice",))
    result = world.ssh.ssh(world.keys["alice"], "res-s", 'printf "%s|" "$HF_TOKEN"; cat /run/secrets/hf_token')
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == f"{TOKEN}|{TOKEN}"

    wait_for(lambda: world.sessions("close"), what="the session's close event")
    said = caplog.text + "".join(event.model_dump_json() for event in world.events)
    assert TOKEN not in said
