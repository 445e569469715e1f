"""Each rule of the serving library is written in one place: these fail when a second
copy of one creeps back (found by reading the library's source, as the architecture
test does)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_serving.engines.base import (
    Engine,
    EngineLimits,
    EngineRequestError,
    SamplingOptions,
)
from mistral_serving.errors import RequestError
from mistral_serving.http.server import error_json
from mistral_serving.protocols.predict import PredictFormat
from mistral_serving.settings import Settings

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
    # protocols/predict.py: predict's `{"error": message}`; OpenAI's is a typed model
    # (protocols/openai/types.py, `ErrorResponse`). The grammar pool's child process
    # reports to its parent over a pipe, not to a client.
    assert where(builds_an_error_body) == {"protocols/predict.py", "structured/grammar_pool.py"}
    builders = where(lambda n: isinstance(n, ast.ClassDef) and n.name == "ErrorResponse")
    assert builders == {"protocols/openai/types.py"}


@given(st.text(max_size=80), st.sampled_from([400, 408, 413, 429, 503]))
def test_the_body_guard_answers_predicts_refusals_in_the_formats_shape(
    message: str, status: int
) -> None:
    import json

    err = RequestError(message, status)
    assert json.loads(error_json("predict", status, message)) == PredictFormat().error_body(err)


# ---- one artifact resolution rule ----


def test_only_artifacts_decides_local_directory_or_hub_snapshot() -> None:
    # The read-ahead decided it too (via cached_snapshot) before it was removed.
    assert where(lambda n: names(n, "cached_snapshot", "_REPO_ID")) == {"artifacts/artifact.py"}
    defined = where(lambda n: isinstance(n, ast.FunctionDef) and n.name == "resolve_artifact")
    assert defined == {"artifacts/artifact.py"}
    # The Hub is called in one place; the volume fill goes through artifacts.download too.
    assert where(lambda n: names(n, "snapshot_download")) == {"artifacts/artifact.py"}


def test_the_read_ahead_is_gone_with_its_setting() -> None:
    from mistral_serving.settings import Settings

    assert "load_prefetch_threads" not in Settings.model_fields
    assert not (SERVING / "prefetch.py").exists()
    with pytest.raises(ImportError):
        __import__("mistral_serving.prefetch")


# ---- one length rule: EngineLimits.fit ----

FIT_REFUSAL = "refused by EngineLimits.fit (the spy)"


@pytest.fixture
def fit_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """EngineLimits.fit replaced by a spy that refuses everything: an engine that still
    checked or clamped lengths itself would answer (or refuse) without asking it."""
    calls: list[tuple[int, int]] = []

    def refuse(self: EngineLimits, prompt_len: int, max_new: int, what: str = "prompt") -> int:
        calls.append((prompt_len, max_new))
        raise EngineRequestError(FIT_REFUSAL)

    monkeypatch.setattr(EngineLimits, "fit", refuse)
    return calls


async def first_delta(engine: Engine, prompt: list[int], max_new: int) -> object:
    stream = engine.generate("fit-1", prompt, SamplingOptions(max_new, top_k=1))
    try:
        return await anext(aiter(stream))
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def assert_asks_fit(engine: Engine, calls: list[tuple[int, int]]) -> None:
    try:
        # A prompt well within every limit, and far too many new tokens: clamped (by fit).
        with pytest.raises(EngineRequestError, match="the spy"):
            asyncio.run(first_delta(engine, [1, 5, 6], 10**6))
    finally:
        engine.shutdown()
    assert calls == [(3, 10**6)]


def test_the_replay_engine_asks_fit(fit_calls: list[tuple[int, int]]) -> None:
    from mistral_gpu_fallback.replay import ReplayEngine

    assert_asks_fit(ReplayEngine([7, 8], 2, EngineLimits(16, 32, 4), 0.001), fit_calls)


@pytest.mark.parametrize("kv_cache", ["dynamic", "static"])
def test_the_pytorch_engines_ask_fit(
    dev_model: Path, kv_cache: str, fit_calls: list[tuple[int, int]]
) -> None:
    from mistral_serving.engines.factory import start_torch_engine

    settings = Settings(artifact=str(dev_model), device="cpu", pytorch_kv_cache=kv_cache)
    assert_asks_fit(start_torch_engine(dev_model, settings, 2), fit_calls)


def test_the_tensorrt_llm_engine_kinds_ask_fit(
    fake_trtllm: object, tmp_path: Path, fit_calls: list[tuple[int, int]]
) -> None:
    from tests.doubles.trtllm_helpers import load, load_pytorch_kind

    assert_asks_fit(load(tmp_path / "engine"), fit_calls)
    fit_calls.clear()
    assert_asks_fit(load_pytorch_kind(tmp_path / "checkpoint"), fit_calls)


def test_the_service_refuses_with_fits_words(tok: object) -> None:
    """The service's length refusals are fit's own message, as a 400 naming the field."""
    from mistral_serving.generation.service import GenerationRequest, GenerationService
    from tests.doubles.scripted_engine import ScriptedEngine

    limits = EngineLimits(max_input_len=8, max_seq_len=12, max_batch_size=2)
    service = GenerationService(Settings(), tok, ScriptedEngine(limits=limits))  # type: ignore[arg-type]
    for ids in ((5,) * 9, (5,) * 12, ()):
        req = GenerationRequest(SamplingOptions(4), prompt_ids=ids, param="prompt")
        with pytest.raises(RequestError) as refused:
            asyncio.run(service.prepare(req))
        with pytest.raises(EngineRequestError) as fit:
            limits.fit(len(ids), 4)
        assert refused.value.message == str(fit.value) and refused.value.param == "prompt"
    req = GenerationRequest(SamplingOptions(100), prompt_ids=(5,) * 8)
    assert asyncio.run(service.prepare(req)).sampling.max_new_tokens == limits.fit(8, 100) == 4


@given(st.integers(-2, 40), st.integers(-2, 40))
def test_fit_clamps_within_the_limits_or_refuses(prompt_len: int, max_new: int) -> None:
    limits = EngineLimits(max_input_len=16, max_seq_len=24, max_batch_size=1)
    try:
        allowed = limits.fit(prompt_len, max_new)
    except EngineRequestError:
        assert not 1 <= prompt_len <= 16 or max_new < 0
        return
    assert allowed == min(max_new, 24 - prompt_len) and prompt_len + allowed <= 24


# ---- wire conventions only in protocols/ ----


def compares_top_p_with_zero(node: ast.AST) -> bool:
    """`x.top_p == 0`, `0 < top_p`, ...: knowing that some route spells "off" as 0."""
    if not isinstance(node, ast.Compare):
        return False
    operands = [node.left, *node.comparators]
    return any(names(o, "top_p") for o in operands) and any(
        isinstance(o, ast.Constant) and o.value == 0 for o in operands
    )


def test_top_p_zero_is_known_only_to_the_wire_formats() -> None:
    assert {m for m in where(compares_top_p_with_zero) if not m.startswith("protocols/")} == set()
    assert where(lambda n: names(n, "top_p_or_off")) <= {
        "protocols/fields.py",
        "protocols/predict.py",
        "protocols/openai.py",
    }


# ---- config.json: read once, into the Artifact ----


def test_every_engine_kind_is_handed_the_artifacts_config(
    dev_model: Path, tok: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The factory passes the Artifact's parsed config.json to the engine kinds that
    used to read it again themselves (TensorRT-LLM's PyTorch backend, the engine
    process); the in-process PyTorch engine gets it too."""
    import dataclasses

    from mistral_gpu_fallback.process.client import ProcessEngine
    from mistral_serving.artifacts.artifact import load_artifact
    from mistral_serving.engines import factory
    from mistral_serving.engines.trtllm.pytorch_backend import TrtLlmPytorchEngine

    artifact = load_artifact(Settings(artifact=str(dev_model)), None)
    artifact = dataclasses.replace(artifact, config=dict(artifact.config, marker="the one read"))
    handed: list[object] = []

    def capture(*args: object, **kwargs: object) -> object:
        handed.append(kwargs.get("config", args[-1]))
        raise RuntimeError("captured")

    monkeypatch.setattr(TrtLlmPytorchEngine, "load", capture)
    monkeypatch.setattr(ProcessEngine, "start", capture)
    monkeypatch.setattr(factory, "start_guided_torch_engine", capture)
    for settings in (
        Settings(artifact=str(dev_model), engine="trtllm_pytorch"),
        Settings(artifact=str(dev_model), engine_process="on", device="cpu"),
        Settings(artifact=str(dev_model), device="cpu"),
    ):
        with pytest.raises(RuntimeError, match="captured"):
            factory.start_engine(artifact, settings, tok)  # type: ignore[arg-type]
    assert handed == [artifact.config] * 3


def test_the_pytorch_backend_sizes_itself_from_the_config_it_is_handed(
    fake_trtllm: object, tmp_path: Path
) -> None:
    from mistral_serving.artifacts.artifact import read_config
    from mistral_serving.engines.trtllm.pytorch_backend import TrtLlmPytorchEngine
    from tests.doubles.trtllm_helpers import make_checkpoint_dir

    checkpoint = make_checkpoint_dir(tmp_path, max_positions=4096)
    config = read_config(checkpoint) | {"max_position_embeddings": 64}
    engine = TrtLlmPytorchEngine.load(checkpoint, Settings(), eos_token_id=2, config=config)
    try:
        assert engine.limits.max_seq_len == 64  # the handed config's, not the file's 4096
    finally:
        engine.shutdown()


def test_the_engine_process_checks_the_config_it_is_handed(dev_model: Path) -> None:
    """The child takes the parent's config.json (a value the file does not hold is what
    it refuses), so it never parses the file again."""
    from mistral_gpu_fallback.process.client import ProcessEngine
    from mistral_serving.artifacts.artifact import read_config
    from mistral_serving.engines.base import EngineError

    config = read_config(dev_model) | {"num_hidden_layers": -1}
    settings = Settings(artifact=str(dev_model), device="cpu")
    with pytest.raises(EngineError, match="num_hidden_layers"):
        ProcessEngine.start(dev_model, settings, 2, config)


def test_config_json_has_one_reader_and_one_error_type(tmp_path: Path) -> None:
    from mistral_serving.artifacts.artifact import ArtifactError, read_config

    for text in ("{", "[]", '{"a": NaN'):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ArtifactError, match="config.json"):
            read_config(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(ArtifactError, match="config.json"):
        read_config(tmp_path)

    # No other module both builds a path to config.json and parses JSON.
    def builds_config_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value == "config.json"
        )

    def parses_json(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        on_json = (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "json"
        )
        return on_json or names(func, "parse_json_object")

    parsers = where(builds_config_path) & where(parses_json)
    assert parsers == set(), parsers


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_read_config_answers_any_bytes_with_a_dict_or_one_artifact_error(data: bytes) -> None:
    import tempfile

    from mistral_serving.artifacts.artifact import ArtifactError, read_config

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_bytes(data)
        try:
            assert isinstance(read_config(Path(folder)), dict)
        except ArtifactError as exc:
            assert "\n" not in str(exc) and "config.json" in str(exc)
