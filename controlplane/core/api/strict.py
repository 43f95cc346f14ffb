"""JSON bodies are read at the types the schema gives: DRF's fields also take a number for text (``{"name": 0}``
becomes "0"), a JSON number for a decimal the schema documents as a string, and an object for a list of
related objects (its keys). Installed once, at start (CoreConfig.ready), for every serializer of every app, so
the schema's ``type`` is the rule and no app needs a field class of its own.

Only data given as a dict is held to this (a parsed JSON body); a form or a query string (a QueryDict) carries
nothing but text.

A text's ``max_length`` (the schema's ``maxLength``) counts the text as sent: DRF trims the blanks around it
first and measures what is left, so "  " + 150 characters passed a 150-character field (schemathesis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from django.http import QueryDict
from rest_framework import fields, relations

_installed = False


def _from_json(field: fields.Field) -> bool:
    """Whether the serializer reads a parsed body (a dict) rather than a form or query string (a QueryDict)."""
    data = getattr(field.root, "initial_data", None)
    return isinstance(data, Mapping) and not isinstance(data, QueryDict)


def _refusing(original: Callable[..., Any], wrong: Callable[[Any], bool], code: str) -> Callable[..., Any]:
    def to_internal_value(self: fields.Field, data: Any) -> Any:
        if wrong(data) and _from_json(self):
            self.fail(code, input_type=type(data).__name__)
        return original(self, data)

    return to_internal_value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _measured_as_sent(original: Callable[..., Any]) -> Callable[..., Any]:
    def to_internal_value(self: fields.CharField, data: Any) -> Any:
        if isinstance(data, str) and self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return original(self, data)

    return to_internal_value


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    fields.CharField.to_internal_value = _refusing(  # type: ignore[method-assign]
        _measured_as_sent(fields.CharField.to_internal_value), _number, "invalid"
    )
    fields.DecimalField.default_error_messages = {
        **fields.DecimalField.default_error_messages,
        "not_a_string": 'Give a decimal as a string, e.g. "1.50".',
    }
    fields.DecimalField.to_internal_value = _refusing(  # type: ignore[method-assign]
        fields.DecimalField.to_internal_value, _number, "not_a_string"
    )
    relations.ManyRelatedField.to_internal_value = _refusing(  # type: ignore[method-assign]
        relations.ManyRelatedField.to_internal_value, lambda v: isinstance(v, Mapping), "not_a_list"
    )
