"""scp (both protocols) and sftp reach the container's file system through the Docker API, and only it."""

from __future__ import annotations

import inspect
import os
import uuid

import asyncssh
import pytest

from nodeagent.gateway.sftp import ContainerSFTPServer

pytestmark = [pytest.mark.docker, pytest.mark.faults]


def inside(world, *argv: str) -> bytes:  # type: ignore[no-untyped-def]
    result = world.container("a").exec_run(list(argv))
    assert result.exit_code == 0, result.output
    return bytes(result.output)


@pytest.mark.parametrize("legacy", [False, True], ids=["sftp-scp", "legacy-scp"])
def test_scp_copies_up_and_down_through_the_containers_file_system(world, tmp_path, legacy):  # type: ignore[no-untyped-def]
    payload = os.urandom(3 * 1024 * 1024 + 17)  # several SFTP reads and writes, not one
    local = tmp_path / "up.bin"
    local.write_bytes(payload)
    target = f"/tmp/up-{uuid.uuid4().hex[:6]}.bin"
    up = world.ssh.scp(world.keys["alice"], str(local), world.ssh.remote("res-a", target), legacy=legacy)
    assert up.returncode == 0, up.stderr
    assert inside(world, "md5sum", target).split()[0] == inside_md5(payload)
    assert not os.path.exists(target)  # nothing of it on the host
    down = tmp_path / "down.bin"
    result = world.ssh.scp(world.keys["alice"], world.ssh.remote("res-a", target), str(down), legacy=legacy)
    assert result.returncode == 0, result.stderr
    assert down.read_bytes() == payload


def inside_md5(data: bytes) -> bytes:
    import hashlib

    return hashlib.md5(data).hexdigest().encode()  # noqa: S324 - a checksum, not security


@pytest.mark.parametrize("legacy", [False, True], ids=["sftp-scp", "legacy-scp"])
def test_a_file_on_the_host_is_not_reachable_even_through_a_symlink(world, tmp_path, legacy):  # type: ignore[no-untyped-def]
    marker = tmp_path / f"host-marker-{uuid.uuid4().hex[:6]}"
    marker.write_text("the host's own file\n")
    # A link inside the container naming the host path: resolved on the host it would reach the marker.
    inside(world, "ln", "-sf", str(tmp_path), "/tmp/hostdir")
    for path in (str(marker), f"/tmp/hostdir/{marker.name}", f"/proc/1/root{marker}"):
        result = world.ssh.scp(
            world.keys["alice"], world.ssh.remote("res-a", path), str(tmp_path / "got"), legacy=legacy
        )
        assert result.returncode != 0, path
        assert b"No such file" in result.stderr, result.stderr
        assert not (tmp_path / "got").exists()


def test_sftp_lists_puts_gets_renames_and_removes_in_the_container(world, tmp_path):  # type: ignore[no-untyped-def]
    (tmp_path / "note.txt").write_text("hello sftp\n")
    inside(world, "sh", "-c", "mkdir -p /srv/data && echo existing > /srv/data/seen.txt")
    result = world.ssh.sftp(
        world.keys["bob"],
        "res-a",
        [
            "cd /srv/data",
            "ls -l",
            "put note.txt",
            "chmod 600 note.txt",
            "mkdir sub",
            "rename note.txt sub/note.txt",
            "get sub/note.txt back.txt",
            "get seen.txt",
            "ls sub",
            "symlink sub/note.txt link.txt",
            "rm seen.txt",
            "pwd",
        ],
        cwd=tmp_path,
    )
    out = result.stdout.decode()
    assert result.returncode == 0, result.stderr.decode() + out
    assert "seen.txt" in out and "sub/note.txt" in out
    assert "Remote working directory: /srv/data" in out
    assert (tmp_path / "back.txt").read_text() == "hello sftp\n"
    assert (tmp_path / "seen.txt").read_text() == "existing\n"
    assert inside(world, "cat", "/srv/data/sub/note.txt") == b"hello sftp\n"
    assert inside(world, "stat", "-c", "%a", "/srv/data/sub/note.txt").strip() == b"600"
    assert inside(world, "readlink", "/srv/data/link.txt").strip() == b"sub/note.txt"
    assert world.container("a").exec_run(["test", "-e", "/srv/data/seen.txt"]).exit_code == 1


def test_sftp_refusals_reach_the_client_and_change_nothing(world, tmp_path):  # type: ignore[no-untyped-def]
    result = world.ssh.sftp(
        world.keys["alice"], "res-a", ["-get /nonexistent/file", "-rmdir /tmp", "-ls /nope", "-rm /bin"], cwd=tmp_path
    )
    err = result.stderr.decode()
    assert 'File "/nonexistent/file" not found' in err
    assert 'remote rmdir "/tmp": Failure' in err  # not empty (OpenSSH prints only the SFTP v3 status)
    assert '"/nope" not found' in err
    assert "remote delete /bin: Failure" in err
    assert inside(world, "ls", "-d", "/tmp", "/bin").split() == [b"/bin", b"/tmp"]


def test_every_file_system_method_of_the_sftp_server_is_the_containers():  # type: ignore[no-untyped-def]
    # asyncssh's defaults open host paths; an inherited one would be a way out of the container.
    pure = {"convert_attrs", "format_longname", "channel", "connection", "env", "logger"}
    inherited = [
        name
        for name, _ in inspect.getmembers(asyncssh.SFTPServer)
        if not name.startswith("_") and name not in pure and name not in ContainerSFTPServer.__dict__
    ]
    assert inherited == []
