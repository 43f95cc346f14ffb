"""A booking naming a template, written out as the request it stands for (docs/templates.md, "Booking").

The expansion runs before the one reading of a booking (reservations/api/serializers.py, ``read_booking``):
what the template gives becomes the request's body, and the booking's own rules and wordings judge the result.
"""

from __future__ import annotations

from typing import Any

from controlplane.core.errors import ValidationFailed
from controlplane.templates import services

# The spec's alternatives: a request that names what to book (a model, a memory or a MIG profile) replaces
# the template's choice whole, since two of them together are refused; so does a request that says how many.
_WHAT = ("gpu_model", "min_memory_mib", "mig_profile")
_WHAT_ALL = (*_WHAT, "slices")
_HOW_MANY = ("gpu_count", "whole_servers")
NAME_MAX = 63


def _refuse(message: str) -> ValidationFailed:
    return ValidationFailed(message, code="unknown_template", fields={"template": [message]})


def merge_spec(template: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The request's spec over the template's, key by key; a key of one of the spec's alternatives replaces
    the template's alternatives."""
    merged = dict(template)
    if any(key in given for key in _WHAT):
        for key in _WHAT_ALL:
            merged.pop(key, None)
    if any(key in given for key in _HOW_MANY):
        for key in _HOW_MANY:
            merged.pop(key, None)
    merged.update(given)
    return merged


def merge_container(template: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The request's container over the template's, key by key; ``env`` variable by variable."""
    merged = {**template, **given}
    if isinstance(template.get("env"), dict) and isinstance(given.get("env"), dict):
        merged["env"] = {**template["env"], **given["env"]}
    return merged


def expand_booking(data: dict[str, Any], *, project: Any, queue: bool = False) -> tuple[dict[str, Any], str]:
    """``data`` with its template written in, and the template's name. The template is the project's own of
    that name, else the operator-wide one. An unknown name is a 400 naming ``template``. ``queue``: a queued
    request's body, whose length is its ``duration``."""
    name = data.get("template")
    if not isinstance(name, str) or not name.strip():
        raise _refuse("Give a template's name as a string.")
    if len(name) > NAME_MAX:
        raise _refuse(f"Ensure this field has no more than {NAME_MAX} characters.")
    template = services.find(name, project)
    if template is None:
        raise _refuse(f"No template named {name!r}: GET /api/v1/templates/?project=<slug> lists those you can use.")
    body = {key: value for key, value in data.items() if key != "template"}
    if template.spec is not None:
        spec = body.get("spec", {})
        body["spec"] = merge_spec(template.spec, spec) if isinstance(spec, dict) else spec
    container = body.get("container", {})
    if isinstance(container, dict):
        # The template's named ports, unless the booking gives its own (docs/proxy.md, "Named ports").
        body["container"] = merge_container({**template.container, "ports": list(template.ports)}, container)
    else:
        body["container"] = container
    window = body.get("window")
    if queue:
        body.setdefault("duration", template.duration_s)
    elif isinstance(window, dict) and "end" not in window and "duration" not in window:
        body["window"] = {**window, "duration": template.duration_s}
    return body, template.name
