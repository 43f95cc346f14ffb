"""MIG profiles and layouts: NVIDIA's published tables, and the placement rule that says whether a layout fits.

A layout is a list of GPU instance profile names ("3g.40gb", "2g.20gb", ...), one entry per GPU instance, each
holding one compute instance that spans it (what ``nvidia-smi mig -cgi ... -C`` makes). The simulated backend
validates layouts here; on a real GPU NVML is the judge (it refuses with ``NVML_ERROR_INSUFFICIENT_RESOURCES``),
and the same check runs first so the refusal says which profile did not fit.

The tables follow NVIDIA's MIG user guide ("Supported MIG Profiles"): a GPU has 8 memory slices and 7 compute
slices; each profile may start only at the listed memory slices and covers ``memory_slices`` from there.
Memory sizes are NVML's ``memorySizeMB`` as the driver reports them (``nvidia-smi mig -lgip``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nodeagent import schema


@dataclass(frozen=True)
class MigProfile:
    name: str  # "3g.40gb", without NVML's "MIG " prefix
    profile_id: int  # NVML's GPU instance profile id (nvidia-smi -lgip "ID")
    nvml_index: str  # the NVML_GPU_INSTANCE_PROFILE_* constant that names it in profile-info calls
    compute_slices: int
    memory_slices: int
    memory_mib: int
    instances: int  # how many fit on an empty GPU
    starts: tuple[int, ...]  # memory slices a GPU instance of this profile may start at


def _table(*rows: tuple[str, int, str, int, int, int, int, tuple[int, ...]]) -> dict[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


_ONE = (0, 1, 2, 3, 4, 5, 6)
_TWO = (0, 2, 4, 6)
_PAIRS = (0, 2, 4)
_HALVES = (0, 4)

# Keyed by the simulated catalog's model key (nodeagent.backends.simulated.CATALOG).
PROFILES: dict[str, dict[str, MigProfile]] = {
    "A100-40GB": _table(
        ("1g.5gb", 19, "NVML_GPU_INSTANCE_PROFILE_1_SLICE", 1, 1, 4864, 7, _ONE),
        ("1g.5gb+me", 20, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 1, 1, 4864, 1, _ONE),
        ("1g.10gb", 15, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 1, 2, 9856, 4, _TWO),
        ("2g.10gb", 14, "NVML_GPU_INSTANCE_PROFILE_2_SLICE", 2, 2, 9856, 3, _PAIRS),
        ("3g.20gb", 9, "NVML_GPU_INSTANCE_PROFILE_3_SLICE", 3, 4, 19968, 2, _HALVES),
        ("4g.20gb", 5, "NVML_GPU_INSTANCE_PROFILE_4_SLICE", 4, 4, 19968, 1, (0,)),
        ("7g.40gb", 0, "NVML_GPU_INSTANCE_PROFILE_7_SLICE", 7, 8, 40192, 1, (0,)),
    ),
    "A100-80GB": _table(
        ("1g.10gb", 19, "NVML_GPU_INSTANCE_PROFILE_1_SLICE", 1, 1, 9728, 7, _ONE),
        ("1g.10gb+me", 20, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 1, 1, 9728, 1, _ONE),
        ("1g.20gb", 15, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 1, 2, 19968, 4, _TWO),
        ("2g.20gb", 14, "NVML_GPU_INSTANCE_PROFILE_2_SLICE", 2, 2, 19968, 3, _PAIRS),
        ("3g.40gb", 9, "NVML_GPU_INSTANCE_PROFILE_3_SLICE", 3, 4, 40320, 2, _HALVES),
        ("4g.40gb", 5, "NVML_GPU_INSTANCE_PROFILE_4_SLICE", 4, 4, 40320, 1, (0,)),
        ("7g.80gb", 0, "NVML_GPU_INSTANCE_PROFILE_7_SLICE", 7, 8, 80896, 1, (0,)),
    ),
    "H100-80GB": _table(
        ("1g.10gb", 19, "NVML_GPU_INSTANCE_PROFILE_1_SLICE", 1, 1, 9856, 7, _ONE),
        ("1g.10gb+me", 20, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 1, 1, 9856, 1, _ONE),
        ("1g.20gb", 15, "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 1, 2, 19968, 4, _TWO),
        ("2g.20gb", 14, "NVML_GPU_INSTANCE_PROFILE_2_SLICE", 2, 2, 19968, 3, _PAIRS),
        ("3g.40gb", 9, "NVML_GPU_INSTANCE_PROFILE_3_SLICE", 3, 4, 40448, 2, _HALVES),
        ("4g.40gb", 5, "NVML_GPU_INSTANCE_PROFILE_4_SLICE", 4, 4, 40448, 1, (0,)),
        ("7g.80gb", 0, "NVML_GPU_INSTANCE_PROFILE_7_SLICE", 7, 8, 80384, 1, (0,)),
    ),
}

COMPUTE_SLICES = 7
MEMORY_SLICES = 8


@dataclass(frozen=True)
class MigResult:
    """How a reconfiguration ended, and why (NVML's error name on a refusal)."""

    outcome: schema.MigOutcome
    message: str


class LayoutError(ValueError):
    """A MIG layout the GPU cannot hold; the message says which profile did not fit and why."""


def profile_name(nvml_name: str) -> str:
    """NVML names a profile "MIG 3g.40gb"; nvidia-smi and this project write "3g.40gb"."""
    name = nvml_name.strip()
    return name[4:] if name.upper().startswith("MIG ") else name


def place(profiles: dict[str, MigProfile], layout: Sequence[str]) -> list[tuple[MigProfile, int]]:
    """Where each GPU instance of ``layout`` starts, in the layout's order; ``LayoutError`` when it does not fit.

    Largest first, trying every start a profile allows (a small exhaustive search: at most 7 instances)."""
    wanted: list[MigProfile] = []
    for name in layout:
        profile = profiles.get(name)
        if profile is None:
            known = ", ".join(profiles)
            raise LayoutError(f"{name!r} is not a MIG profile of this GPU; it offers {known}")
        wanted.append(profile)
    for profile in set(wanted):
        count = sum(1 for p in wanted if p is profile)
        if count > profile.instances:
            raise LayoutError(f"at most {profile.instances} x {profile.name} fit on this GPU, the layout asks {count}")
    compute = sum(p.compute_slices for p in wanted)
    if compute > COMPUTE_SLICES:
        raise LayoutError(f"the layout needs {compute} compute slices; the GPU has {COMPUTE_SLICES}")
    order = sorted(range(len(wanted)), key=lambda i: (-wanted[i].memory_slices, -wanted[i].compute_slices, i))
    starts: dict[int, int] = {}

    def fits(k: int, used: frozenset[int]) -> bool:
        if k == len(order):
            return True
        i = order[k]
        profile = wanted[i]
        for start in profile.starts:
            covered = frozenset(range(start, start + profile.memory_slices))
            if max(covered) < MEMORY_SLICES and not covered & used:
                starts[i] = start
                if fits(k + 1, used | covered):
                    return True
        return False

    if not fits(0, frozenset()):
        raise LayoutError(
            "the profiles " + " + ".join(layout) + " do not fit together: no placement of them on the GPU's "
            f"{MEMORY_SLICES} memory slices avoids an overlap"
        )
    return [(wanted[i], starts[i]) for i in range(len(wanted))]


def parse_layout(text: str) -> list[str]:
    """ "3g.40gb+2g.20gb+2x1g.10gb" -> ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]. Empty: MIG on, no instances."""
    layout: list[str] = []
    for part in (p.strip() for p in text.split(",")) if "," in text else _plus_parts(text):
        if not part:
            continue
        count, sep, name = part.partition("x")
        if sep and count.isdigit():
            layout.extend([name] * int(count))
        else:
            layout.append(part)
    return layout


def _plus_parts(text: str) -> Iterable[str]:
    # "+me" belongs to the profile before it ("1g.10gb+me"), so split on "+" only before a digit.
    parts: list[str] = []
    for piece in text.split("+"):
        if parts and not piece[:1].isdigit():
            parts[-1] += "+" + piece
        else:
            parts.append(piece.strip())
    return parts
