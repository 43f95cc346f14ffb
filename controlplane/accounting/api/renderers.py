from __future__ import annotations

from typing import Any

from rest_framework.renderers import BaseRenderer

from controlplane.accounting.efficiency import ranking_csv, statement_csv
from controlplane.accounting.statements import report_csv


class ReportCSVRenderer(BaseRenderer):
    """The rows of a report (and its totals line) as CSV; errors stay in the API's JSON shape."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, dict) and "reservations" in data and "fleet" in data and "error" not in data:
            return statement_csv(data).encode()  # an efficiency statement
        if isinstance(data, dict) and "projects" in data and "fleet" in data and "error" not in data:
            return ranking_csv(data).encode()  # the operator's ranking
        if isinstance(data, dict) and "rows" in data and "error" not in data:
            return report_csv(
                data["rows"],
                data.get("totals"),
                data.get("storage"),
                data.get("total_credits"),
                reclaimed_gpu_hours=data.get("reclaimed_gpu_hours"),
            ).encode()
        if isinstance(data, list):
            return report_csv(data).encode()
        import json

        if renderer_context and renderer_context.get("response") is not None:
            renderer_context["response"]["Content-Type"] = "application/json"  # what it is: an error in JSON
        return json.dumps(data, default=str).encode()
