"""The API's parsers: JSON and forms, refusing what no field could store before any view sees it.

- Text with a NUL character or a lone UTF-16 surrogate, in any string or key: PostgreSQL refuses NUL in text
  and UTF-8 cannot encode a lone surrogate, so either would reach the database (a slug looked up, a name
  stored) and fail there as a 500.
- JSON nested deeper than ``MAX_JSON_DEPTH``: Python's decoder recurses once per level and fails with a
  RecursionError near 1,000 levels; no request needs more than a few. The depth is measured on the raw text,
  without recursion, before the decoder runs.
- Numbers too large for a float (``1e400``), which would be read as infinity, and which JSON cannot carry
  back out.

Each refusal is a 400 ``validation_error`` naming the field's dotted path (``container.env.A``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.conf import settings
from django.http import QueryDict
from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

MAX_JSON_DEPTH = 32

NUL_MESSAGE = "Null characters are not allowed."
_SURROGATE = re.compile("[\ud800-\udfff]")
# Where a NUL or a surrogate can appear in valid JSON text: as an escape (raw ones are refused by the decoder,
# or by UTF-8 decoding). An escaped backslash before "u0000" matches too; the walk then finds nothing.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
# Strings (whose brackets do not count) and the structural characters, for the depth scan.
_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_TOKENS = re.compile(_STRINGS.pattern + r"|[\[\]{},]")
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (a sentence), or None when it can."""
    if "\x00" in value:
        return NUL_MESSAGE
    surrogate = _SURROGATE.search(value)
    if surrogate:
        return f"Surrogate characters are not allowed: U+{ord(surrogate.group()):X}."
    return None


def field_label(key: object) -> str:
    """A key as it appears in an error's field path; one that cannot be written back as text is escaped."""
    text = str(key)
    return json.dumps(text)[1:-1] if text_problem(text) else text


def _dotted(path: list[object]) -> str:
    return ".".join(field_label(part) for part in path) or "body"


# Where the path of a too deep body is looked for: a body nested too deep early is named precisely; one whose
# excess comes after this many tokens (a crafted body) is refused as a whole, so the refusal costs no more
# than the reading would have.
_PATH_SCAN_TOKENS = 100_000


def _deeper_than(text: str, limit: int) -> bool:
    """Whether ``text`` nests containers more than ``limit`` deep, at C speed: with strings and everything but
    brackets removed, each round of deleting innermost pairs peels one level off every container."""
    brackets = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    for _ in range(limit):
        brackets = _INNERMOST.sub("", brackets)
        if not brackets:
            return False
    return True


def _path_past(text: str, limit: int, tokens: int) -> tuple[str | None, bool]:
    """(the path where ``text`` first nests past ``limit``, whether the first ``tokens`` tokens were all read)."""
    # One frame per open container: [is an object, its current key or index].
    frames: list[list[Any]] = []
    expect_key = False
    for count, match in enumerate(_TOKENS.finditer(text)):
        if count >= tokens:
            return None, False
        token = match.group()
        first = token[0]
        if first == '"':
            if expect_key:
                frames[-1][1] = token[1:-1]
                expect_key = False
        elif first in "[{":
            if len(frames) >= limit:
                return _dotted([frame[1] for frame in frames]), True
            frames.append([first == "{", None if first == "{" else 0])
            expect_key = first == "{"
        elif first in "]}":
            if frames:
                frames.pop()
            expect_key = False
        elif frames:  # a comma
            if frames[-1][0]:
                expect_key = True
            else:
                frames[-1][1] += 1
    return None, True


def _too_deep(text: str, limit: int) -> str | None:
    """The path at which ``text`` nests more than ``limit`` containers, or None. Never recurses."""
    if text.count("[") + text.count("{") <= limit:
        return None
    # A body nested too deep at its start (the usual attack) is named from its first tokens at once.
    path, whole = _path_past(text, limit, 4 * limit)
    if path is not None or whole:
        return path
    if not _deeper_than(text, limit):
        return None
    path, whole = _path_past(text, limit, _PATH_SCAN_TOKENS)
    if path is not None:
        return path
    # Too deep past the scan: the body as a whole. Or the brackets do not pair up: not JSON, as the decoder says.
    return None if whole else "body"


def _unstorable(node: Any, path: list[object]) -> tuple[str, str] | None:
    """The first (path, message) of a string or key that cannot be stored, depth first; depth is bounded."""
    if isinstance(node, str):
        problem = text_problem(node)
        return (_dotted(path), problem) if problem else None
    if isinstance(node, dict):
        for key, value in node.items():
            problem = text_problem(key)
            if problem:
                return _dotted([*path, key]), problem
            found = _unstorable(value, [*path, key])
            if found:
                return found
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found = _unstorable(value, [*path, index])
            if found:
                return found
    return None


def _finite(literal: str) -> float:
    value = float(literal)
    if math.isinf(value):
        raise ValueError(f"the number {literal[:40]} is out of range")
    return value


def _refuse_at(path: str, message: str) -> ValidationError:
    return ValidationError({path: [message]})


def parse_json(raw: bytes, encoding: str = "utf-8") -> Any:
    """Decode a JSON body as the API reads it, or raise the API's 400 (ParseError or ValidationError)."""
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ParseError(f"JSON parse error - the body is not valid {encoding}: {exc.reason}.")
    deep = _too_deep(text, MAX_JSON_DEPTH)
    if deep is not None:
        raise _refuse_at(deep, f"Nested more than {MAX_JSON_DEPTH} levels deep.")
    try:
        data = json.loads(text, parse_float=_finite, parse_constant=_no_constant)
    except ValueError as exc:
        raise ParseError(f"JSON parse error - {exc}")
    if _SUSPECT_ESCAPE.search(text):
        found = _unstorable(data, [])
        if found:
            raise _refuse_at(*found)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_form(data: QueryDict) -> None:
    for key, values in data.lists():
        problem = text_problem(key) or next((p for p in map(text_problem, values) if p), None)
        if problem:
            raise _refuse_at(field_label(key), problem)


def _encoding(parser_context: Any) -> str:
    encoding = str((parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET)
    try:
        # A text codec only: "bz2_codec" and the like would expand the body after its size was checked.
        "".encode(encoding)
    except (LookupError, UnicodeError):
        raise ParseError(f'Unsupported charset "{encoding}" in the Content-Type header.')
    return encoding


class JSONParser(parsers.JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return parse_json(stream.read(), _encoding(parser_context))


class FormParser(parsers.FormParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _check_form(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        parsed = super().parse(stream, media_type, parser_context)
        _check_form(parsed.data)
        return parsed
