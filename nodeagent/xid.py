"""XID events: how the agent words them. Whether one makes a GPU unhealthy is the control plane's call."""

from __future__ import annotations

from datetime import datetime

from nodeagent import schema

# The XIDs an operator meets most often, worded after NVIDIA's XID catalog.
XID_DESCRIPTIONS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 exception",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def is_application_xid(xid: int) -> bool:
    """True for XIDs the program on the GPU causes; they say nothing about the GPU's health."""
    return xid in schema.APPLICATION_XIDS


def xid_message(xid: int) -> str:
    description = XID_DESCRIPTIONS.get(xid, "see NVIDIA's XID catalog")
    if is_application_xid(xid):
        return f"application XID {xid}: {description} (caused by the program, not the GPU)"
    return f"XID {xid}: {description}"


def xid_event(*, uuid: str, xid: int, ts: datetime) -> schema.AgentEvent:
    return schema.AgentEvent(kind="xid", ts=ts, uuid=uuid, xid=xid, message=xid_message(xid))
