"""Mount propagation from the agent's mount table: never shared, ``rslave`` only where the engine allows it."""

from __future__ import annotations

from pathlib import Path

from nodeagent.runtime.mounts import propagation_for, read_mountinfo

MOUNTINFO = """\
22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
30 22 0:40 / /srv/volumes rw,relatime shared:12 - nfs4 storage:/export rw
31 22 0:41 / /private rw,relatime - ext4 /dev/vdb1 rw
32 31 0:42 / /private/slave rw,relatime master:7 - ext4 /dev/vdc1 rw
33 22 0:43 / /srv/with\\040space rw - tmpfs none rw
"""


def table(tmp_path: Path) -> list[tuple[str, list[str]]]:
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    return read_mountinfo(path)


def test_a_source_on_a_shared_or_slave_mount_gets_rslave(tmp_path: Path) -> None:
    mounts = table(tmp_path)
    assert propagation_for(Path("/srv/volumes/proj-a/work"), mounts) == "rslave"
    assert propagation_for(Path("/private/slave/data"), mounts) == "rslave"


def test_a_source_on_a_private_mount_gets_rprivate_even_under_a_shared_parent(tmp_path: Path) -> None:
    mounts = table(tmp_path)
    # The closest mount decides: /private is private although / is shared.
    assert propagation_for(Path("/private/data"), mounts) == "rprivate"
    assert propagation_for(Path("/srv/with space/x"), mounts) == "rprivate"
    # A prefix of a name is not a parent: /private-other sits on /, which is shared.
    assert propagation_for(Path("/private-other/x"), mounts) == "rslave"


def test_an_unreadable_mount_table_means_rprivate(tmp_path: Path) -> None:
    mounts = read_mountinfo(tmp_path / "absent")
    assert mounts == []
    assert propagation_for(Path("/srv/volumes/x"), mounts) == "rprivate"
