"""Query parameters, read one way across the API: a parameter given empty (``?start=``) is a parameter not given,
and a parameter that takes one value is a 400 naming it when given twice (``?offset=1&offset=2``), never the
last one silently. The schema says the same (``allowEmptyValue`` on every optional query parameter,
controlplane/core/api/schema.py); django-filter's filters are read so by ``FilterBackend``
(controlplane/core/api/filter_backend.py), hand-read parameters through ``query_data``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import forms
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

TWICE = "Give this parameter once."


def refuse_repeats(request: Request, single: Iterable[str]) -> None:
    """A 400 naming each of ``single`` (parameters that take one value) given more than once."""
    params = request.query_params
    errors = {name: [TWICE] for name in single if len([v for v in params.getlist(name) if v != ""]) > 1}
    if errors:
        raise ValidationError(errors)


_MANY = (
    serializers.ListField,
    serializers.MultipleChoiceField,
    forms.MultipleChoiceField,
    forms.ModelMultipleChoiceField,
)


def takes_many(field: Any) -> bool:
    return isinstance(field, _MANY)


def query_data(request: Request, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    """The query string as data for ``serializer_class``: empty values left out, repeats of a one-value field
    refused, a list field given all its values."""
    fields = serializer_class().fields
    refuse_repeats(request, [name for name, field in fields.items() if not takes_many(field)])
    data: dict[str, Any] = {}
    for name in request.query_params:
        values = [v for v in request.query_params.getlist(name) if v != ""]
        if values:
            data[name] = values if takes_many(fields.get(name)) else values[0]
    return data
