"""Query-string filters the API's apps share."""

from __future__ import annotations

from typing import Any

import django_filters
from django.core.exceptions import ValidationError
from django.utils.dateparse import parse_datetime
from django_filters.fields import IsoDateTimeField

from controlplane.core.api.fields import NAIVE_MESSAGE


class AwareIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time that says its time zone, as AwareDateTimeField reads a body's."""

    default_error_messages = {"naive": NAIVE_MESSAGE}

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str):
            try:
                parsed = parse_datetime(value.strip())
            except ValueError:
                parsed = None
            if parsed is not None and parsed.tzinfo is None:
                raise ValidationError(self.error_messages["naive"], code="naive")
        return super().to_python(value)


class AwareIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    """IsoDateTimeFilter, refusing a date-time without a time zone (a 400 naming the parameter)."""

    field_class = AwareIsoDateTimeField
