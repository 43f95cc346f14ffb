"""django-filter, read as the rest of the API reads query parameters (controlplane/core/api/query.py): empty is
absent, a one-value filter given twice is a 400, and a filter naming an object that does not exist (``?rack=9``
for a rack that is not there, or not visible) finds nothing rather than failing: the answer is an empty page,
as for any other filter that matches nothing. A value of the wrong type (``?rack=x``) is still a 400."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import QuerySet
from django_filters import utils
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from controlplane.core.api.query import refuse_repeats, takes_many


def _names_a_missing_object(form: forms.Form, name: str, value: Any) -> bool:
    """Whether ``value`` for the object-choice field ``name`` is well formed and only names nothing."""
    field = form.fields.get(name)
    if not isinstance(field, forms.ModelChoiceField) or isinstance(field, forms.ModelMultipleChoiceField):
        return False
    if field.queryset is None:
        return False
    model = field.queryset.model
    model_field = model._meta.get_field(field.to_field_name) if field.to_field_name else model._meta.pk
    try:
        model_field.to_python(value)
    except (DjangoValidationError, TypeError, ValueError):
        return False
    return True


class FilterBackend(DjangoFilterBackend):
    def filter_queryset(self, request: Request, queryset: QuerySet, view: Any) -> QuerySet:
        filterset = self.get_filterset(request, queryset, view)
        if filterset is None:
            return queryset
        form = filterset.form
        refuse_repeats(request, [name for name, field in form.fields.items() if not takes_many(field)])
        # A yes/no filter reads anything but true/false/1/0 as "not given"; here it is a 400 naming it.
        wrong = {
            name: ["Give true or false."]
            for name, field in form.fields.items()
            if isinstance(field, forms.NullBooleanField)
            and request.query_params.get(name, "") not in ("", "true", "false", "True", "False", "1", "0")
        }
        if wrong:
            raise ValidationError(wrong)
        if not filterset.is_valid():
            errors = form.errors.as_data()
            if all(
                all(e.code == "invalid_choice" for e in errs)
                and _names_a_missing_object(form, name, request.query_params.get(name))
                for name, errs in errors.items()
            ):
                return queryset.none()
            raise utils.translate_validation(form.errors)
        return filterset.qs
