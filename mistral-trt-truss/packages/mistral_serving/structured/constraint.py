"""What a request asks of structured output, as every engine receives it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class GuidedDecoding:
    """Constrain the output to JSON: any JSON object, or one valid for `json_schema`."""

    kind: Literal["json_object", "json_schema"]
    json_schema: str | None = None  # the schema as JSON text (kind json_schema)
