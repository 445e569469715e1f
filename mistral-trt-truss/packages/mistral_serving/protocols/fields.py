"""Field definitions the wire formats share (as llama-cpp-python's `types.py` does).

Bounds are written once here; each protocol picks its own defaults. Every request model
is strict: "2" is not a number, true is not 1, and unknown fields are refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from mistral_serving.errors import RequestError

MAX_STOP_STRINGS = 16
MAX_PARTS = 4096  # text parts of one content field
MAX_TOKENS_LIMIT = 1 << 20  # above any engine's sequence limit; the engine's limit clamps


class StrictModel(BaseModel):
    """Strict types, unknown fields refused, no NaN/Infinity."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def _one_or_list(v: object) -> object:
    return [v] if isinstance(v, str) else v


StopString = Annotated[str, Field(min_length=1, max_length=256)]
# A string or a list of strings (use as `Stop | None`).
Stop = Annotated[
    list[StopString], BeforeValidator(_one_or_list), Field(max_length=MAX_STOP_STRINGS)
]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
TopK = Annotated[int, Field(ge=0, le=1 << 20, description="1: greedy; 0: off")]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=10.0)]
AdditivePenalty = Annotated[float, Field(ge=-2.0, le=2.0)]
MinTokens = Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)]


def top_p_or_off(top_p: float) -> float:
    """Our engines take 1.0 as "off"; the predict route also says 0 for off."""
    return top_p if 0.0 < top_p < 1.0 else 1.0


def describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """One readable line per problem (`field: message`) and the first field's name."""
    parts = []
    first: str | None = None
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        first = first or loc or None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc or 'body'}: {msg}"[:300])
    return "; ".join(parts[:8]), first


def validate(model: type[StrictModel], body: dict[str, Any]) -> StrictModel:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = describe_validation_error(exc)
        raise RequestError(message, param=param) from None


def validate_at(model: type[StrictModel], value: Any, where: str) -> StrictModel:
    """`fields.validate`, with the refusal's field named from the body's top."""
    if not isinstance(value, dict):
        raise RequestError(f"{where} must be an object", param=where)
    try:
        return validate(model, value)
    except RequestError as err:
        param = f"{where}.{err.param}" if err.param else where
        raise RequestError(f"{where}.{err.message}", param=param) from None


def text_of(value: Any, where: str, parts: Mapping[str, type[StrictModel]]) -> str:
    """A content field's text: a string, or a list of parts of the kinds in `parts` (their
    `text`, or a refusal's `refusal`, joined by a blank line); any other part is refused
    by its place (`input[0].content[2].type`)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or len(value) > MAX_PARTS:
        raise RequestError(
            f"{where} must be a string or a list of at most {MAX_PARTS} parts", param=where
        )
    texts = []
    for j, raw in enumerate(value):
        at = f"{where}[{j}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        model = parts.get(kind) if isinstance(kind, str) else None
        if model is None:
            named = ", ".join(parts)
            raise RequestError(f"{at}.type: only {named} parts are supported", param=f"{at}.type")
        part = validate_at(model, raw, at)
        text = getattr(part, "text", None)
        texts.append(text if isinstance(text, str) else str(getattr(part, "refusal", "")))
    return "\n\n".join(texts)
