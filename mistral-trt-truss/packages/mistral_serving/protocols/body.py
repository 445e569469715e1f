"""Raw request bytes -> a JSON object, refusing anything a strict parser should.

Truss would parse bodies itself (and answer 500 to some); our routes take the raw
request, and every body goes through `decode_json_object`: strict UTF-8, no NaN or
Infinity, bounded nesting, no lone UTF-16 surrogates (they cannot be encoded for the
tokenizer), and a JSON object at the top. Each refusal is one `RequestError` line.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from mistral_serving.errors import RequestError

MAX_DEPTH = 32  # our bodies nest 4 deep (messages -> message -> content -> part)
MAX_INT_DIGITS = 4300  # int() refuses longer strings (a plain ValueError, not a JSON error)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> Any:
    raise RequestError(f"request body is not valid JSON: {name} is not a JSON number")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise RequestError(f"request body holds an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: as refused as Infinity itself
        raise RequestError(f"request body holds a number out of range: {text[:32]}")
    return value


def decode_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise RequestError("request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(
            text, parse_constant=_refuse_constant, parse_int=_parse_int, parse_float=_parse_float
        )
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise RequestError(f"request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise RequestError(f"request body must be a JSON object, not {_json_type(value)}")
    _check(value)
    return value


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _check(root: dict[str, Any]) -> None:
    """Depth and surrogates, iteratively (a recursive walk is what deep bodies break)."""
    stack: list[tuple[Any, str, int]] = [(root, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestError(f"request body nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, f"{path}.{key}" if path else key, is_key=True)
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, path or "body")


def _check_text(text: str, path: str, is_key: bool = False) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        what = "a key" if is_key else path[:64]
        raise RequestError(
            f"{what}: string contains a lone UTF-16 surrogate; send valid Unicode",
            param=None if is_key else path[:64],
        )
