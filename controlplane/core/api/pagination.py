"""limit/offset paging, strict: a limit or offset that is not a whole number in range, or is given twice, is a
400 naming it (DRF's own silently falls back to the default), and the schema says what is accepted."""

from __future__ import annotations

import re
from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

_WHOLE = re.compile(r"-?[0-9]+")
# Past this an offset skips more rows than any table holds (and than SQLite's OFFSET takes).
MAX_OFFSET = 1_000_000_000


def query_int(request: Request, name: str, *, default: int, minimum: int, maximum: int | None = None) -> int:
    """A whole-number query parameter: absent (or empty) is ``default``; anything else not in range is a 400."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise ValidationError({name: ["Give this parameter once."]})
    if not values or values[0] == "":
        return default
    raw = values[0]
    if len(raw) > 40 or not _WHOLE.fullmatch(raw):
        raise ValidationError({name: [f"A whole number is required, not {raw[:40]!r}."]})
    value = int(raw)  # at most 40 digits: cheap
    if value < minimum:
        raise ValidationError({name: [f"Ensure this value is greater than or equal to {minimum}."]})
    if maximum is not None and value > maximum:
        raise ValidationError({name: [f"Ensure this value is less than or equal to {maximum}."]})
    return value


class Pagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500

    def get_limit(self, request: Request) -> int:
        return query_int(request, self.limit_query_param, default=self.default_limit, minimum=1, maximum=self.max_limit)

    def get_offset(self, request: Request) -> int:
        return query_int(request, self.offset_query_param, default=0, minimum=0, maximum=MAX_OFFSET)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        return [
            {
                "name": self.limit_query_param,
                "required": False,
                "in": "query",
                "description": f"Results per page ({self.default_limit} unless given).",
                "schema": {"type": "integer", "minimum": 1, "maximum": self.max_limit},
            },
            {
                "name": self.offset_query_param,
                "required": False,
                "in": "query",
                "description": "How many results to skip.",
                "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET},
            },
        ]
