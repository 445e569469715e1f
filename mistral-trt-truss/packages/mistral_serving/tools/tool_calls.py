"""The request side of tool calling: `tools`, `tool_choice`, `parallel_tool_calls`, history.

One strict reading for every route: a bad field is a `RequestError` (400) whose `param`
names it, the same as the rest of the API. The result is plain data the prompt builder
and the constrained decoder consume; nothing here knows a model format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mistral_serving.errors import RequestError

# OpenAI's rule for function names.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_JSON_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tool:
    """One offered function."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool


@dataclass(frozen=True)
class ToolRequest:
    """What the request asked for; `forced` is the one function a named choice demands."""

    tools: tuple[Tool, ...]
    choice: str  # none | auto | required | named
    forced: str | None
    parallel: bool

    @property
    def constrained(self) -> bool:
        """Whether the output must be calls (required or a named function)."""
        return bool(self.tools) and self.choice in ("required", "named")


def tool_texts(tools: Sequence[Tool]) -> Iterator[str]:
    """The offered tools' texts that reach the prompt and cost nothing to measure (their
    `parameters_text` is the rest)."""
    for tool in tools:
        yield tool.name
        yield tool.description


def parameters_text(tools: Sequence[Tool]) -> str:
    """The tools' parameter schemas as the prompt spells them (JSON): as long as the
    body's own, so it is built off the event loop."""
    return json.dumps([tool.parameters for tool in tools], ensure_ascii=False)


def _check_schema(schema: Any, where: str, depth: int = 0) -> None:
    # A structural check of the JSON-schema subset a call's arguments can follow:
    # type names known, properties/required/items well formed. Deep enough to catch
    # typos without a validator dependency in the serving image.
    if depth > 32:
        raise RequestError(f"{where}: schema nested too deeply", param=where)
    if not isinstance(schema, dict):
        raise RequestError(f"{where} must be a JSON-schema object", param=where)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for k in kinds:
        if k not in _JSON_TYPES:
            raise RequestError(f"{where}.type: unknown JSON type {k!r}", param=f"{where}.type")
    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise RequestError(f"{where}.properties must be an object", param=f"{where}.properties")
        for key, sub in props.items():
            _check_schema(sub, f"{where}.properties.{key}", depth + 1)
    required = schema.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise RequestError(f"{where}.required must be a list of names", param=f"{where}.required")
    items = schema.get("items")
    if items is not None and not isinstance(items, bool):
        _check_schema(items, f"{where}.items", depth + 1)


@dataclass(frozen=True)
class ToolShape:
    """Where one API puts a function's fields in a `tools` entry (named in refusals)."""

    nested: bool  # under "function" (chat completions), or at the entry's top level
    types: frozenset[str | None]  # the entry's accepted `type` values (None: may be absent)
    params: str  # the key of the arguments' JSON schema
    params_required: bool = False
    ignored: frozenset[str] = frozenset()  # accepted keys without an effect here


# `{"type": "function", "function": {"name", "description", "parameters", "strict"}}`
CHAT_TOOLS = ToolShape(nested=True, types=frozenset({"function"}), params="parameters")
# The Responses API: `{"type": "function", "name", "description", "parameters", "strict"}`
RESPONSES_TOOLS = ToolShape(nested=False, types=frozenset({"function"}), params="parameters")
# Anthropic's client tools: `{"name", "description", "input_schema"}`, `type` "custom" or none
ANTHROPIC_TOOLS = ToolShape(
    nested=False,
    types=frozenset({None, "custom"}),
    params="input_schema",
    params_required=True,
    ignored=frozenset({"cache_control"}),
)


def _function_of(entry: Any, where: str, shape: ToolShape) -> tuple[dict[str, Any], str]:
    """(the function's fields, where they sit) of one `tools` entry."""
    kind = entry.get("type") if isinstance(entry, dict) else "?"
    if not isinstance(entry, dict) or kind not in shape.types:
        named = " or ".join(repr(t) for t in sorted(t for t in shape.types if t is not None))
        raise RequestError(
            f"{where}.type must be {named} (only function tools are supported)",
            param=f"{where}.type",
        )
    if not shape.nested:
        fields = {k: v for k, v in entry.items() if k != "type" and k not in shape.ignored}
        return fields, where
    fn = entry.get("function")
    if not isinstance(fn, dict):
        raise RequestError(f"{where}.function must be an object", param=f"{where}.function")
    return fn, f"{where}.function"


def _parse_function(fn: dict[str, Any], where: str, shape: ToolShape) -> Tool:
    unknown = set(fn) - {"name", "description", shape.params, "strict"}
    if unknown:
        field = sorted(unknown)[0]
        raise RequestError(f"{where}.{field} is not supported", param=f"{where}.{field}")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise RequestError(f"{where}.name must be 1-64 of [A-Za-z0-9_-]", param=f"{where}.name")
    desc = fn.get("description", "")
    if not isinstance(desc, str):
        raise RequestError(f"{where}.description must be a string", param=f"{where}.description")
    if shape.params_required and shape.params not in fn:
        raise RequestError(f"{where}.{shape.params} is required", param=f"{where}.{shape.params}")
    params = fn.get(shape.params, {"type": "object", "properties": {}})
    _check_schema(params, f"{where}.{shape.params}")
    if params.get("type", "object") != "object":
        raise RequestError(
            f"{where}.{shape.params}.type must be 'object'", param=f"{where}.{shape.params}.type"
        )
    strict = fn.get("strict", False)
    if not isinstance(strict, bool):
        raise RequestError(f"{where}.strict must be a boolean", param=f"{where}.strict")
    return Tool(name, desc, params, strict)


def parse_tools(raw: Any, shape: ToolShape = CHAT_TOOLS) -> tuple[Tool, ...]:
    """`tools` as sent, in `shape`: a list of functions, each offered once."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError("tools must be a list", param="tools")
    if not raw:  # OpenAI refuses an empty list too
        raise RequestError("tools must hold at least one function", param="tools")
    seen: set[str] = set()
    out: list[Tool] = []
    for i, entry in enumerate(raw):
        fn, where = _function_of(entry, f"tools[{i}]", shape)
        tool = _parse_function(fn, where, shape)
        if tool.name in seen:
            raise RequestError(
                f"{where}.name {tool.name!r} is offered twice", param=f"{where}.name"
            )
        seen.add(tool.name)
        out.append(tool)
    return tuple(out)


def parse_tool_request(body: Mapping[str, Any], shape: ToolShape = CHAT_TOOLS) -> ToolRequest:
    """`tools`, `tool_choice` and `parallel_tool_calls` of one request, checked together
    (OpenAI's vocabulary; a named choice is `{"type": "function", "function": {"name"}}`,
    or `{"type": "function", "name"}` where the tools are flat, as in the Responses API)."""
    tools = parse_tools(body.get("tools"), shape)
    raw_choice = body.get("tool_choice")
    forced: str | None = None
    if raw_choice is None:
        choice = "auto" if tools else "none"
    elif isinstance(raw_choice, str):
        if raw_choice not in _CHOICES:
            raise RequestError(
                "tool_choice must be none, auto, required or a function", param="tool_choice"
            )
        choice = raw_choice
    elif isinstance(raw_choice, dict):
        choice, forced = "named", _named_choice(raw_choice, tools, shape)
    else:
        raise RequestError("tool_choice must be a string or an object", param="tool_choice")
    if choice != "none" and raw_choice is not None and not tools:
        raise RequestError(f"tool_choice {choice!r} needs tools", param="tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None and not shape.nested:
        parallel = True  # the Responses API's SDKs send null for "the default"
    if not isinstance(parallel, bool):
        raise RequestError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    return ToolRequest(tools, choice, forced, parallel)


def _named_choice(raw: dict[str, Any], tools: tuple[Tool, ...], shape: ToolShape) -> str:
    """The function a named `tool_choice` forces; it must be offered."""
    fn = raw.get("function") if shape.nested else raw
    if raw.get("type") != "function" or not isinstance(fn, dict):
        wanted = "{'type': 'function', " + (
            "'function': {'name': ...}}" if shape.nested else "'name': ...}"
        )
        raise RequestError(f"tool_choice must be {wanted}", param="tool_choice")
    name = fn.get("name")
    if not isinstance(name, str) or name not in {t.name for t in tools}:
        param = "tool_choice.function.name" if shape.nested else "tool_choice.name"
        raise RequestError(f"tool_choice names {name!r}, which is not in tools", param=param)
    return name


def check_history(messages: Sequence[Any]) -> None:
    """Assistant `tool_calls` well formed; every `tool` message answers an earlier call."""
    open_ids: set[str] = set()
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            continue  # the chat parser names this one
        role = msg.get("role")
        calls = msg.get("tool_calls")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise RequestError(
                    f"messages[{i}].tool_calls must be a list on an assistant message",
                    param=f"messages[{i}].tool_calls",
                )
            for j, call in enumerate(calls):
                where = f"messages[{i}].tool_calls[{j}]"
                fn = call.get("function") if isinstance(call, dict) else None
                cid = call.get("id") if isinstance(call, dict) else None
                if not isinstance(cid, str) or not cid:
                    raise RequestError(
                        f"{where}.id must be a non-empty string", param=f"{where}.id"
                    )
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise RequestError(
                        f"{where}.function.name must be a string", param=f"{where}.function.name"
                    )
                if not isinstance(fn.get("arguments"), str):
                    raise RequestError(
                        f"{where}.function.arguments must be a JSON string",
                        param=f"{where}.function.arguments",
                    )
                open_ids.add(cid)
        if role == "tool":
            cid = msg.get("tool_call_id")
            if not isinstance(cid, str) or cid not in open_ids:
                raise RequestError(
                    f"messages[{i}].tool_call_id {cid!r} answers no earlier tool call",
                    param=f"messages[{i}].tool_call_id",
                )
