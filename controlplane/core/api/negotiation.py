"""Content negotiation whose refusal of an unknown ``?format=`` is a 400 naming the parameter and the formats
the endpoint has, in the API's error shape; DRF's own answers 404, as if the endpoint did not exist."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation


class ContentNegotiation(DefaultContentNegotiation):
    def filter_renderers(self, renderers: Any, format: str) -> Any:
        try:
            return super().filter_renderers(renderers, format)
        except Http404:
            known = ", ".join(sorted({r.format for r in renderers}))
            raise ValidationError({"format": [f"Not a format of this endpoint; give one of: {known}."]})
