"""The GPU health rule, as NVIDIA's own tools judge it. Pure functions: the ingest feeds them, tests drive them.

A GPU is unhealthy while it has at least one reason. Reasons come in two kinds:

* transient - ``temperature`` (over ``FLEET_GPU_TEMP_LIMIT_C``) and ``missing`` (not reported): recomputed on
  every heartbeat, so they clear on their own when the cause clears;
* hardware faults - ``xid:<n>`` (a critical XID), ``ecc_dbe`` (the volatile double-bit ECC count rose),
  ``retired_pages_pending`` and ``row_remap_failure``: sticky until an operator acknowledges, and raised again
  at the next heartbeat if the cause is still present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nodeagent import schema

MISSING = "missing"
TEMPERATURE = "temperature"
ECC_DBE = "ecc_dbe"
RETIRED_PAGES_PENDING = "retired_pages_pending"
ROW_REMAP_FAILURE = "row_remap_failure"
XID_PREFIX = "xid:"

TRANSIENT = frozenset({MISSING, TEMPERATURE})


def is_hardware_fault(reason: str) -> bool:
    return reason not in TRANSIENT


@dataclass(frozen=True)
class Health:
    reasons: tuple[str, ...]
    needs_acknowledgement: bool

    @property
    def healthy(self) -> bool:
        return not self.reasons


def _positive(value: float | None) -> bool:
    return value is not None and value > 0


def evaluate(
    *,
    current_reasons: Iterable[str],
    present: bool,
    previous_fields: Mapping[str, float | None] | None,
    dbe_readings: Sequence[float | None],
    latest: Mapping[str, float | None] | None,
    xids: Iterable[int],
    temp_limit_c: float,
) -> Health:
    """The GPU's health after one heartbeat.

    ``current_reasons`` is what the GPU has now; ``previous_fields`` its latest sample before this heartbeat;
    ``dbe_readings`` the volatile double-bit ECC counter in this heartbeat's new samples, in time order;
    ``latest`` the newest new sample's fields (None when the heartbeat brought no new sample); ``xids`` the XIDs
    reported for it.
    """
    current = set(current_reasons)
    reasons = {r for r in current if is_hardware_fault(r)}

    if not present:
        reasons.add(MISSING)
    for xid in xids:
        if xid not in schema.APPLICATION_XIDS:
            reasons.add(f"{XID_PREFIX}{xid}")

    # A rise of the volatile DBE counter is a new uncorrectable error; the counter itself only resets with the
    # driver, so its level says nothing new once acknowledged.
    previous_dbe = (previous_fields or {}).get(schema.ECC_DBE_VOL)
    for dbe in dbe_readings:
        if dbe is None:
            continue
        if (previous_dbe is None and dbe > 0) or (previous_dbe is not None and dbe > previous_dbe):
            reasons.add(ECC_DBE)
        previous_dbe = dbe

    if latest is not None:
        if _positive(latest.get(schema.RETIRED_PENDING)):
            reasons.add(RETIRED_PAGES_PENDING)
        if _positive(latest.get(schema.ROW_REMAP_FAILURE)):
            reasons.add(ROW_REMAP_FAILURE)
        temp = latest.get(schema.GPU_TEMP)
        if temp is not None and temp > temp_limit_c:
            reasons.add(TEMPERATURE)
    elif present and TEMPERATURE in current:
        # No reading in this heartbeat: nothing says the GPU cooled down.
        reasons.add(TEMPERATURE)

    ordered = tuple(sorted(reasons))
    return Health(reasons=ordered, needs_acknowledgement=any(is_hardware_fault(r) for r in ordered))


def after_acknowledgement(current_reasons: Iterable[str]) -> Health:
    """Acknowledging clears the hardware faults; a transient cause still present keeps the GPU unhealthy."""
    remaining = tuple(sorted(r for r in current_reasons if not is_hardware_fault(r)))
    return Health(reasons=remaining, needs_acknowledgement=False)
