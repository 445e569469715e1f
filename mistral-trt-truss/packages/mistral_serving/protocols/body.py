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
import sys
from typing import Any

from mistral_serving.errors import RequestError

MAX_DEPTH = 32  # our bodies nest 4 deep (messages -> message -> content -> part)
# The interpreter's own bound on an integer's digits (Python's default; the image does not
# change it with PYTHONINTMAXSTRDIGITS): json.loads refuses longer ones with a ValueError.
MAX_INT_DIGITS = sys.get_int_max_str_digits()
_SURROGATE = re.compile("[\ud800-\udfff]")


def _refuse_constant(name: str) -> Any:
    raise RequestError(f"request body is not valid JSON: {name} is not a JSON number")


def decode_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise RequestError("request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        # Numbers are parsed in C (a Python hook per number was most of a token-id
        # prompt's cost); what the hooks refused is refused below and in `_check`.
        value = json.loads(text, parse_constant=_refuse_constant)
    except RequestError:  # NaN or Infinity (a RequestError is a ValueError too)
        raise
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"request body is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except ValueError:  # an integer over MAX_INT_DIGITS: int()'s own plain ValueError
        raise RequestError(
            f"request body holds an integer of more than {MAX_INT_DIGITS} digits"
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


_SCALARS = frozenset({int, bool, type(None)})  # nothing to check in these


def _check(root: dict[str, Any]) -> None:
    """Depth, finite numbers and surrogates, iteratively (a recursive walk is what deep
    bodies break). Only containers are stacked, and a list of plain numbers (a token-id
    prompt) is passed over in one C-level look at its types; a field's path is worked
    out only for a refusal."""
    stack: list[tuple[dict[str, Any] | list[Any], int]] = [(root, 1)]
    while stack:
        container, depth = stack.pop()
        if container and depth >= MAX_DEPTH:  # its items would be one level too deep
            raise RequestError(f"request body nests deeper than {MAX_DEPTH} levels")
        if isinstance(container, dict):
            for key in container:
                if not key.isascii() and _SURROGATE.search(key):
                    raise RequestError(
                        "a key: string contains a lone UTF-16 surrogate; send valid Unicode"
                    )
            items: Any = container.values()
        else:
            if set(map(type, container)) <= _SCALARS:
                continue
            items = container
        for item in items:
            kind = type(item)
            if kind is dict or kind is list:
                stack.append((item, depth + 1))
            elif kind is str:
                if not item.isascii() and _SURROGATE.search(item):
                    path = _path_to(root, item)
                    raise RequestError(
                        f"{path[:64]}: string contains a lone UTF-16 surrogate; send valid Unicode",
                        param=path[:64],
                    )
            elif kind is float and not math.isfinite(item):
                # A finite literal too large for a float (1e999) is as refused as Infinity.
                raise RequestError(
                    f"request body holds a number out of range: {_path_to(root, item)}"
                )


def _path_to(root: Any, target: object) -> str:
    """The dotted path of `target` (this very object) in `root`: for a refusal's message."""
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        value, path = stack.pop()
        if value is target:
            return path or "body"
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else k) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{path}.{i}") for i, v in enumerate(value))
    return "body"
