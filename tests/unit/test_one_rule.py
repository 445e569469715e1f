"""Each rule of the serving library is written in one place: these fail when a second
copy of one creeps back (found by reading the library's source, as the architecture
test does)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_serving.errors import RequestError
from mistral_serving.protocols.predict import PredictFormat
from mistral_serving.server import error_json

SERVING = Path(__file__).resolve().parents[2] / "mistral-trt-truss/packages/mistral_serving"


def modules() -> dict[str, ast.Module]:
    return {
        str(path.relative_to(SERVING)): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(SERVING.rglob("*.py"))
    }


def where(predicate: object) -> set[str]:
    """The modules holding a node for which `predicate(node)` is true."""
    assert callable(predicate)
    return {name for name, tree in modules().items() if any(map(predicate, ast.walk(tree)))}


def names(node: ast.AST, *wanted: str) -> bool:
    return (isinstance(node, ast.Name) and node.id in wanted) or (
        isinstance(node, ast.Attribute) and node.attr in wanted
    )


# ---- one error body per route shape ----


def builds_an_error_body(node: ast.AST) -> bool:
    """A dict display whose keys include "error" (an error answer being shaped)."""
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "error" for k in node.keys
    )


def test_error_bodies_are_shaped_only_in_their_formats() -> None:
    # errors.py: OpenAI's `{"error": {...}}`; protocols/predict.py: predict's. The grammar
    # pool's child process reports to its parent over a pipe, not to a client.
    assert where(builds_an_error_body) == {
        "errors.py",
        "protocols/predict.py",
        "grammar_pool.py",
    }


@given(st.text(max_size=80), st.sampled_from([400, 408, 413, 429, 503]))
def test_the_body_guard_answers_predicts_refusals_in_the_formats_shape(
    message: str, status: int
) -> None:
    import json

    err = RequestError(message, status)
    assert json.loads(error_json("predict", status, message)) == PredictFormat().error_body(err)


# ---- one artifact resolution rule ----


def test_only_artifacts_decides_local_directory_or_hub_snapshot() -> None:
    assert where(lambda n: names(n, "snapshot_download", "cached_snapshot")) == {"artifacts.py"}


def test_the_read_ahead_is_gone_with_its_setting() -> None:
    from mistral_serving.settings import Settings

    assert "load_prefetch_threads" not in Settings.model_fields
    assert not (SERVING / "prefetch.py").exists()
    with pytest.raises(ImportError):
        __import__("mistral_serving.prefetch")
