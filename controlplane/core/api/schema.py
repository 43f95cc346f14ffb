"""The OpenAPI schema tells the truth about errors: every operation documents the refusals it can give, each in
the API's one error shape (controlplane/core/api/errors.py).

``AutoSchema`` (settings.REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]) adds to each operation's responses, unless the
view already documents that status itself:

* 400 where the request carries anything to validate: a body or query parameters;
* 401 where the view authenticates with a scheme that answers 401 (a bearer token; a session alone answers 403);
* 403 where a permission may refuse the caller, and on every write a session can make (CSRF);
* 404 where the path names an object (it may not exist, or not be the caller's);
* 409 on every authenticated write (the state does not allow it, or another writer won: retry);
* 411 where there is a body: one sent chunked to a server that cannot read it (Django's development server;
  gunicorn reads it, controlplane/core/api/middleware.py);
* 413 where there is a body (API_MAX_REQUEST_BYTES);
* 414 where there are path or query parameters (API_MAX_URL_BYTES);
* 429 where the view is throttled;
* whatever else the view names in ``schema_error_statuses``, for refusals its code raises that no declaration
  shows: a tuple for all its operations, or a dict by method (``{"POST": ("404",)}`` where a body names a
  project that may not be the caller's).

Every optional query parameter is documented with ``allowEmptyValue``: the API reads ``?p=`` as ``p`` not
given (controlplane/core/api/query.py); a free-text path or query parameter, as admitting no NUL.

``postprocess`` (SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]) mends what drf-spectacular writes wrongly for
every operation: a type list that names "null" twice; and it says of every object a request carries that its
keys admit no NUL, as the parsers refuse one in any key. ``AutoSchema`` also writes a decimal's pattern as the
field parses it (drf-spectacular's admits "" and a sign below the field's minimum).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import inline_serializer
from rest_framework import permissions, serializers
from rest_framework.authentication import SessionAuthentication

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
NO_NUL = "^[^\\u0000]*$"

# Permissions that never refuse an authenticated caller a read; a permission class may say the same of itself
# with ``refuses_only_writes = True``.
_READ_OPEN_PERMISSIONS = (permissions.AllowAny, permissions.IsAuthenticated, permissions.IsAuthenticatedOrReadOnly)

ERROR_DESCRIPTIONS: dict[str, str] = {
    "400": "The request is not valid; `error.fields` names what was wrong.",
    "401": "Authentication credentials were not provided or are not valid.",
    "403": "The caller may not do this (a role, an operator-only endpoint, or a failed CSRF check).",
    "404": "No such object among the caller's.",
    "409": "The current state does not allow this, or another writer won (retry).",
    "411": "A body sent with Transfer-Encoding (chunked) that this server cannot read: send a Content-Length.",
    "413": "The request body is too large.",
    "414": "The path and query string are too long (API_MAX_URL_BYTES).",
    "429": "Too many requests; `error.retry_after_s` says when to retry.",
}

ErrorSerializer = inline_serializer(
    name="Error",
    fields={
        "error": inline_serializer(
            name="ErrorDetail",
            fields={
                "code": serializers.CharField(help_text="Stable, for automation: validation_error, not_found, ..."),
                "message": serializers.CharField(help_text="A sentence a person understands."),
                "fields": serializers.DictField(
                    child=serializers.ListField(child=serializers.CharField()),
                    help_text="Dotted field paths and their messages.",
                ),
            },
        )
    },
)


class AutoSchema(SpectacularAutoSchema):
    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        statuses = self.error_statuses(operation)
        if statuses:
            ref = self.resolve_serializer(ErrorSerializer, "response").ref
            for code in statuses:
                responses.setdefault(
                    code,
                    {"description": ERROR_DESCRIPTIONS[code], "content": {"application/json": {"schema": ref}}},
                )
        operation["responses"] = dict(sorted(responses.items()))
        for parameter in operation.get("parameters", []):
            schema = parameter.get("schema", {})
            if parameter.get("in") == "query" and not parameter.get("required") and schema.get("type") != "array":
                parameter["allowEmptyValue"] = True
            if (
                parameter.get("in") in ("query", "path")
                and schema.get("type") == "string"
                and not {"pattern", "format", "enum"} & set(schema)
            ):
                # ApiGuardMiddleware refuses a NUL in any path or query parameter (PostgreSQL cannot store one).
                parameter["schema"] = {**schema, "pattern": NO_NUL}
        return operation

    def _map_serializer_field(self, field: Any, direction: Any, bypass_extensions: bool = False) -> Any:
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        if (
            isinstance(field, serializers.DecimalField)
            and isinstance(schema, dict)
            and schema.get("format") == "decimal"
            and "pattern" in schema
        ):
            schema["pattern"] = decimal_pattern(field)
        return schema

    def error_statuses(self, operation: dict[str, Any]) -> list[str]:
        method = self.method.upper()
        parameters = operation.get("parameters", [])
        has_body = "requestBody" in operation
        authenticators = self.view.get_authenticators()
        perms = self.view.get_permissions()
        open_to_anyone = all(isinstance(p, permissions.AllowAny) for p in perms)
        statuses: list[str] = []
        if has_body or any(p.get("in") in ("query", "header") for p in parameters):
            statuses.append("400")
        if authenticators and _answers_401(authenticators[0]):
            statuses.append("401")
        session = any(isinstance(a, SessionAuthentication) for a in authenticators)
        may_refuse = any(
            not isinstance(p, _READ_OPEN_PERMISSIONS) and not getattr(p, "refuses_only_writes", False) for p in perms
        )
        if may_refuse or (method in UNSAFE_METHODS and (session or not open_to_anyone)):
            statuses.append("403")
        if any(p.get("in") == "path" for p in parameters):
            statuses.append("404")
        if method in UNSAFE_METHODS and not open_to_anyone:
            statuses.append("409")
        if has_body:
            statuses += ["411", "413"]
        if any(p.get("in") in ("query", "path") for p in parameters):
            statuses.append("414")
        if self.view.get_throttles():
            statuses.append("429")
        named = getattr(self.view, "schema_error_statuses", ())
        if isinstance(named, dict):
            named = named.get(method, ())
        statuses += [str(code) for code in named if str(code) not in statuses]
        return sorted(statuses)


def _answers_401(authenticator: Any) -> bool:
    try:
        return bool(authenticator.authenticate_header(None))
    except Exception:
        return False


def decimal_pattern(field: serializers.DecimalField) -> str:
    """What the field parses: drf-spectacular's ^-?\\d{0,N}(?:\\.\\d{0,M})?$ admits "", "-" and "." (no digit at
    all) and a sign where the field's minimum forbids one; and, where both bounds are whole numbers of no sign
    (a site's PUE, 1 to 5), the bounds themselves."""
    whole = max(int(field.max_whole_digits or 0), 1)
    places = int(field.decimal_places or 0)
    bounded = _bounded_decimal_pattern(field.min_value, field.max_value, places)
    if bounded is not None:
        return bounded
    sign = "" if field.min_value is not None and field.min_value >= 0 else "-?"
    # A minimum of one step above zero (0.0001 with 4 places): any value but zero, so some digit is not 0.
    step = Decimal(1).scaleb(-places)
    nonzero = "(?=.*[1-9])" if field.min_value is not None and 0 < field.min_value <= step else ""
    if places == 0:
        return rf"^{nonzero}{sign}\d{{1,{whole}}}$"
    return rf"^{nonzero}{sign}(?:\d{{1,{whole}}}(?:\.\d{{0,{places}}})?|\.\d{{1,{places}}})$"


def _bounded_decimal_pattern(low: Any, high: Any, places: int) -> str | None:
    """A pattern admitting exactly the decimals from ``low`` to ``high`` with at most ``places`` places, when both
    are whole and not negative; None otherwise. Leading zeros are admitted, as the field reads "01.5" as 1.5."""
    if low is None or high is None:
        return None
    low, high = Decimal(low), Decimal(high)
    if low < 0 or low >= high or low != low.to_integral_value() or high != high.to_integral_value():
        return None
    below = "|".join(_integer_range(int(low), int(high) - 1))
    fraction, zeros = (rf"(?:\.\d{{0,{places}}})?", rf"(?:\.0{{0,{places}}})?") if places else ("", "")
    alternatives = [f"(?:{below}){fraction}", f"{int(high)}{zeros}"]
    if low == 0 and places:
        alternatives.append(rf"\.\d{{1,{places}}}")
    return f"^0*(?:{'|'.join(alternatives)})$"


def _integer_range(low: int, high: int) -> list[str]:
    """Alternatives matching the integers from ``low`` to ``high``, written without leading zeros."""
    out: list[str] = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        start = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        end = min(high, 10**digits - 1)
        if start <= end:
            out += _same_width_range(str(start), str(end))
    return out


def _same_width_range(low: str, high: str) -> list[str]:
    width = len(low)
    if low == high:
        return [low]
    if width == 1:
        return [f"[{low}-{high}]"]
    if low[0] == high[0]:
        return [low[0] + rest for rest in _same_width_range(low[1:], high[1:])]
    out: list[str] = []
    first, last = int(low[0]), int(high[0])
    if low[1:] != "0" * (width - 1):
        out += [low[0] + rest for rest in _same_width_range(low[1:], "9" * (width - 1))]
        first += 1
    if high[1:] != "9" * (width - 1):
        last -= 1
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        out.append(digit + rf"\d{{{width - 1}}}")
    if high[1:] != "9" * (width - 1):
        out += [high[0] + rest for rest in _same_width_range("0" * (width - 1), high[1:])]
    return out


def _mend(node: Any) -> None:
    if isinstance(node, dict):
        types = node.get("type")
        if isinstance(types, list) and len(set(types)) != len(types):
            node["type"] = list(dict.fromkeys(types))
        for value in node.values():
            _mend(value)
    elif isinstance(node, list):
        for item in node:
            _mend(item)


# What a key no field reads may carry: the API ignores it, but its parsers refuse a NUL anywhere in the body.
EXTRA_VALUE = "ExtraValue"
_EXTRA_REF = {"$ref": f"#/components/schemas/{EXTRA_VALUE}"}
_EXTRA_VALUE_SCHEMA = {
    "description": "Any JSON value with no NUL character in its strings or keys (the API ignores it).",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": _EXTRA_REF},
        {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": _EXTRA_REF},
    ],
}


def _keys_admit_no_nul(node: Any) -> None:
    """The parsers refuse a NUL in any key or string (core/api/parsers.py), in a key no field reads too: say so
    of every object a request body may carry, so that the schema admits no body the API refuses."""
    if isinstance(node, dict):
        if node.get("type") == "object" and "propertyNames" not in node and "additionalProperties" not in node:
            node["propertyNames"] = {"pattern": NO_NUL}
            node["additionalProperties"] = _EXTRA_REF
        for value in node.values():
            _keys_admit_no_nul(value)
    elif isinstance(node, list):
        for item in node:
            _keys_admit_no_nul(item)


def postprocess(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    _mend(result)
    # COMPONENT_SPLIT_REQUEST: what a request carries is a component of its own, named ...Request.
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request"):
            _keys_admit_no_nul(component)
    result.setdefault("components", {}).setdefault("schemas", {})[EXTRA_VALUE] = _EXTRA_VALUE_SCHEMA
    return result
