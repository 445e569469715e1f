"""Settings.load: model_metadata values, MTT_* overrides, refusals naming the field."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from mistral_serving.settings import (
    ENV_PREFIX,
    FIELDS,
    AdmissionSettings,
    ArtifactSettings,
    GpuFallbackSettings,
    GrammarSettings,
    LimitsSettings,
    OpsSettings,
    ResponseStoreSettings,
    ServerSettings,
    Settings,
    SettingsError,
    TorchEngineSettings,
    TrtllmSettings,
    unknown_settings,
)


def test_defaults_with_nothing_given() -> None:
    s = Settings.load(None, env={})
    assert s == Settings()
    assert s.artifact == "" and s.engine == "auto" and s.verify_hashes is True
    assert s.max_input_len is None and s.max_seq_len is None
    assert s.max_inflight == 256 and s.max_waiting == 512
    assert s.kv_cache_free_gpu_memory_fraction == 0.9
    assert Settings.load({}, env={}) == s


def test_model_metadata_values() -> None:
    meta = {
        "artifact": "org/engine",
        "artifact_revision": "abc123",
        "engine": "tensorrt_llm",
        "max_batch_size": 8,
        "max_input_len": 1024,
        "max_seq_len": 4096,
        "verify_hashes": False,
        "drain_grace_seconds": 5,
        "log_prompts": True,
    }
    s = Settings.load(meta, env={})
    for k, v in meta.items():
        assert getattr(s, k) == v


def test_unknown_metadata_keys_ignored() -> None:
    s = Settings.load(
        {
            "artifact": "a",
            "example_model_input": {"prompt": "x"},
            "pretty_name": "Mistral",
            "avatar_url": None,
        },
        env={},
    )
    assert s.artifact == "a"
    assert not hasattr(s, "pretty_name")


def test_other_env_vars_are_ignored() -> None:
    s = Settings.load({}, env={"PATH": "/bin", "ARTIFACT": "no", "mtt_max_inflight": "3"})
    assert s == Settings()


@pytest.mark.parametrize(
    ("variable", "line"),
    [
        ("MTT_MAX_INFLITE", "MTT_MAX_INFLITE is not a setting (did you mean MTT_MAX_INFLIGHT?)"),
        ("MTT_max_inflight", "MTT_max_inflight is not a setting (did you mean MTT_MAX_INFLIGHT?)"),
        (
            "MTT_NOT_A_SETTING",
            "MTT_NOT_A_SETTING is not a setting (every setting: docs/settings.md)",
        ),
    ],
)
def test_an_unknown_mtt_variable_is_refused_with_the_nearest_name(variable: str, line: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.load({}, env={variable: "3", "MTT_MAX_WAITING": "4"})
    assert str(err.value) == line


# Names as a typo makes them: a setting's name with one character changed, added or dropped.
EDIT_ALPHABET = "abcdefghijklmnopqrstuvwxyz_0123456789"


@st.composite
def one_edit_from_a_setting(draw: st.DrawFn) -> tuple[str, str]:
    name = draw(st.sampled_from(FIELDS))
    at = draw(st.integers(0, len(name)))
    char = draw(st.sampled_from(EDIT_ALPHABET))
    kind = draw(st.sampled_from(["insert", "replace", "delete"]))
    if kind == "insert":
        typo = name[:at] + char + name[at:]
    elif kind == "replace":
        typo = name[:at] + char + name[at + 1 :]
    else:
        typo = name[:at] + name[at + 1 :]
    return name, typo


@settings(max_examples=300, deadline=None)
@given(edit=one_edit_from_a_setting(), as_variable=st.booleans())
def test_a_one_character_typo_is_refused_with_a_setting_to_try(
    edit: tuple[str, str], as_variable: bool
) -> None:
    _, typo = edit
    if typo in FIELDS:  # the edit made another real name
        return
    name = ENV_PREFIX + typo.upper() if as_variable else typo
    problem = unknown_settings([name], variables=as_variable)
    assert problem is not None and "\n" not in problem
    suggested = re.fullmatch(r".* is not a setting \(did you mean (\S+)\?\)", problem)
    assert suggested, problem
    if as_variable:
        assert suggested[1].startswith(ENV_PREFIX) and suggested[1] == suggested[1].upper()
        assert suggested[1].removeprefix(ENV_PREFIX).lower() in FIELDS
    else:
        assert suggested[1] in FIELDS


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(
        st.sampled_from(FIELDS) | st.text(st.characters(codec=None, exclude_categories=())),
        max_size=5,
    ),
    as_variables=st.booleans(),
)
def test_any_names_are_accepted_exactly_when_each_is_a_setting(
    names: list[str], as_variables: bool
) -> None:
    """Fuzzed: the check of `--set` keys and of `MTT_*` variables refuses a list of names
    exactly when one is no setting, in one printable line naming each such name."""
    if as_variables:
        names = [ENV_PREFIX + (n.upper() if n in FIELDS else n) for n in names]
        known = [n.removeprefix(ENV_PREFIX).lower() in FIELDS and n == n.upper() for n in names]
    else:
        known = [n in FIELDS for n in names]
    problem = unknown_settings(names, variables=as_variables)
    if all(known):
        assert problem is None
        if as_variables:  # the server takes the names (a value may still be refused)
            try:
                Settings.load({}, env=dict.fromkeys(names, ""))
            except SettingsError as err:
                assert str(err).startswith("invalid settings: ")
        return
    assert problem is not None
    assert len(problem.splitlines()) == 1 and problem.isprintable()
    assert problem.count("is not a setting") == known.count(False)
    if as_variables:
        with pytest.raises(SettingsError, match="is not a setting"):
            Settings.load({}, env=dict.fromkeys(names, ""))


def test_env_overrides_metadata_with_coercion() -> None:
    meta = {
        "artifact": "from-meta",
        "max_batch_size": 8,
        "verify_hashes": True,
        "kv_cache_free_gpu_memory_fraction": 0.5,
        "engine": "pytorch",
    }
    env = {
        "MTT_ARTIFACT": "/models/engine",
        "MTT_MAX_BATCH_SIZE": "32",
        "MTT_VERIFY_HASHES": "false",
        "MTT_KV_CACHE_FREE_GPU_MEMORY_FRACTION": "0.75",
        "MTT_ENGINE": "tensorrt_llm",
        "MTT_MAX_SEQ_LEN": "8192",
        "MTT_DRAIN_GRACE_SECONDS": "2.5",
        "MTT_LOG_PROMPTS": "1",
    }
    s = Settings.load(meta, env=env)
    assert s.artifact == "/models/engine"
    assert s.max_batch_size == 32 and type(s.max_batch_size) is int
    assert s.verify_hashes is False
    assert s.kv_cache_free_gpu_memory_fraction == 0.75
    assert s.engine == "tensorrt_llm"
    assert s.max_seq_len == 8192
    assert s.drain_grace_seconds == 2.5
    assert s.log_prompts is True


def test_env_empty_string_clears_optional_but_not_artifact() -> None:
    s = Settings.load(
        {"max_input_len": 100, "artifact_revision": "v1", "artifact": "a"},
        env={"MTT_MAX_INPUT_LEN": "", "MTT_ARTIFACT_REVISION": "", "MTT_ARTIFACT": ""},
    )
    assert s.max_input_len is None and s.artifact_revision is None
    assert s.artifact == ""


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MTT_MAX_INFLIGHT", "7")
    assert Settings.load({}).max_inflight == 7


@pytest.mark.parametrize(
    ("meta", "env", "field"),
    [
        ({"engine": "onnx"}, {}, "engine"),
        ({}, {"MTT_ENGINE": "vllm"}, "engine"),
        ({"max_batch_size": 0}, {}, "max_batch_size"),
        ({}, {"MTT_MAX_BATCH_SIZE": "many"}, "max_batch_size"),
        ({}, {"MTT_MAX_BATCH_SIZE": "1.5"}, "max_batch_size"),
        ({}, {"MTT_VERIFY_HASHES": "perhaps"}, "verify_hashes"),
        ({"kv_cache_free_gpu_memory_fraction": 0}, {}, "kv_cache_free_gpu_memory_fraction"),
        ({}, {"MTT_KV_CACHE_FREE_GPU_MEMORY_FRACTION": "1.5"}, "kv_cache_free_gpu_memory_fraction"),
        ({"max_num_tokens": 8}, {}, "max_num_tokens"),
        ({"max_waiting": -1}, {}, "max_waiting"),
        ({}, {"MTT_DRAIN_GRACE_SECONDS": "-1"}, "drain_grace_seconds"),
        ({"device": "tpu"}, {}, "device"),
        ({"torch_dtype": "int8"}, {}, "torch_dtype"),
        ({"max_seq_len": 1}, {}, "max_seq_len"),
        ({}, {"MTT_MAX_INPUT_LEN": "0"}, "max_input_len"),
        ({}, {"MTT_MAX_BATCH_SIZE": ""}, "max_batch_size"),  # "" -> None: not an int
        ({"artifact": "~no-such-user-here/model"}, {}, "artifact"),  # no home to expand
        ({}, {"MTT_CACHE_DIR": "~no-such-user-here"}, "cache_dir"),
        ({}, {"MTT_METRICS_NAMES": "http2"}, "metrics_names"),
    ],
)
def test_invalid_values_name_the_field(meta: dict, env: dict, field: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load(meta, env=env)
    message = str(info.value)
    assert message.startswith("invalid settings: ")
    assert field in message
    assert "\n" not in message  # one actionable line


@pytest.mark.parametrize(("input_len", "seq_len"), [(4096, 4096), (5000, 4096)])
def test_max_input_len_must_be_below_max_seq_len(input_len: int, seq_len: int) -> None:
    with pytest.raises(SettingsError, match="max_input_len must be below max_seq_len"):
        Settings.load({"max_input_len": input_len, "max_seq_len": seq_len}, env={})
    with pytest.raises(SettingsError, match="max_input_len"):
        Settings.load({"max_input_len": input_len}, env={"MTT_MAX_SEQ_LEN": str(seq_len)})
    ok = Settings.load({"max_input_len": seq_len - 1, "max_seq_len": seq_len}, env={})
    assert (ok.max_input_len, ok.max_seq_len) == (seq_len - 1, seq_len)


def test_limits_error_is_one_clean_line() -> None:
    # like schema.describe_validation_error: no empty location, no pydantic "Value error, "
    with pytest.raises(SettingsError) as info:
        Settings.load({"max_input_len": 10, "max_seq_len": 10}, env={})
    message = str(info.value)
    assert "Value error" not in message
    assert ": :" not in message
    assert message == "invalid settings: max_input_len must be below max_seq_len"


def test_settings_are_frozen() -> None:
    s = Settings.load({}, env={})
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        s.max_inflight = 1  # type: ignore[misc]


def test_cache_path_expands_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/tester")
    s = Settings.load({}, env={"MTT_CACHE_DIR": "~/cache"})
    assert str(s.cache_path) == "/home/tester/cache"


@settings(max_examples=100, deadline=None)
@given(value=st.integers(1, 4096), via_env=st.booleans())
def test_int_settings_roundtrip(value: int, via_env: bool) -> None:
    for name in ("max_batch_size", "max_inflight"):
        if via_env:
            s = Settings.load({}, env={ENV_PREFIX + name.upper(): str(value)})
        else:
            s = Settings.load({name: value}, env={})
        assert getattr(s, name) == value


@settings(max_examples=200, deadline=None)
@given(artifact=st.text(max_size=40), cache_dir=st.text(max_size=40))
def test_any_path_setting_loads_or_is_refused_in_one_line(artifact: str, cache_dir: str) -> None:
    try:
        s = Settings.load({"artifact": artifact, "cache_dir": cache_dir}, env={})
    except SettingsError as exc:
        assert "\n" not in str(exc)
        return
    s.cache_path  # noqa: B018 - expands without raising


# ---- every setting has a finite, sane range; text settings are printable UTF-8 ----

NUMERIC = [
    name
    for name, f in Settings.model_fields.items()
    if f.annotation in (int, float, int | None, float | None)
]


def upper_bound(name: str) -> float:
    """The setting's declared `le` (every numeric setting has one: the test below)."""
    bounds = [m for m in Settings.model_fields[name].metadata if hasattr(m, "le")]
    return bounds[0].le if bounds else math.inf


def test_every_numeric_setting_has_an_upper_bound() -> None:
    for name in NUMERIC:
        assert upper_bound(name) < 10**12, name


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("drain_grace_seconds", "inf"),
        ("drain_grace_seconds", "nan"),
        ("body_timeout_seconds", "1e400"),
        ("max_body_bytes", "1" + "0" * 22),
        ("max_waiting", str(10**9)),
        ("engine_stall_unready_seconds", "-inf"),
        ("served_model_name", "caf\udce9"),  # a Latin-1 byte in a UTF-8 environment
        ("served_model_name", "two words"),
        ("served_model_name", "a\x00b"),
        ("artifact", "/models/\x1b[31mred"),
    ],
)
def test_absurd_values_are_refused_in_one_line(name: str, raw: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.load({}, env={ENV_PREFIX + name.upper(): raw})
    message = str(err.value)
    assert name in message and "\n" not in message
    message.encode("utf-8")  # printable wherever it is logged


def test_the_stall_exit_limit_is_not_below_the_unready_limit() -> None:
    with pytest.raises(SettingsError, match="engine_stall_exit_seconds"):
        Settings.load(
            {}, env={"MTT_ENGINE_STALL_UNREADY_SECONDS": "60", "MTT_ENGINE_STALL_EXIT_SECONDS": "5"}
        )
    s = Settings.load({}, env={"MTT_ENGINE_STALL_UNREADY_SECONDS": "5"})
    assert s.engine_stall_unready_seconds == 5 and s.engine_stall_exit_seconds == 120


@settings(max_examples=400, deadline=None)
@given(
    name=st.sampled_from(sorted(Settings.model_fields)),
    raw=st.text(st.characters(codec=None, exclude_categories=()), max_size=30)
    | st.sampled_from(["inf", "-inf", "nan", "1e308", "1e309", "0", "-1", "9" * 30, "\udcff"])
    | st.integers(-(10**30), 10**30).map(str)
    | st.floats().map(repr),
)
def test_any_env_value_loads_sanely_or_is_refused_in_one_line(name: str, raw: str) -> None:
    try:
        s = Settings.load({}, env={ENV_PREFIX + name.upper(): raw})
    except SettingsError as err:
        assert "\n" not in str(err)
        str(err).encode("utf-8")
        return
    for field in NUMERIC:
        value = getattr(s, field)
        if value is not None:
            # Within the setting's own bound (prefill_logits_bytes' is 2**36: bytes).
            assert math.isfinite(value) and abs(value) <= upper_bound(field), field
    for field, value in s.model_dump().items():
        if isinstance(value, str):
            value.encode("utf-8")
            assert value.isprintable(), field
    assert s.served_model_name and not any(c.isspace() for c in s.served_model_name)


# ---- concerns ----

CONCERNS = (
    ArtifactSettings,
    ServerSettings,
    AdmissionSettings,
    ResponseStoreSettings,
    LimitsSettings,
    TorchEngineSettings,
    TrtllmSettings,
    GpuFallbackSettings,
    GrammarSettings,
    OpsSettings,
)


def test_every_setting_belongs_to_a_concern_and_settings_is_each_of_them() -> None:
    s = Settings.load({}, env={})
    assert all(isinstance(s, concern) for concern in CONCERNS)
    # `engine` (which engine serves) is the only knob of the whole: the factory reads it.
    covered = set().union(*(c.model_fields for c in CONCERNS))
    assert set(Settings.model_fields) - covered == {"engine"}


def test_an_engine_concern_holds_the_shared_limits_and_nothing_of_the_server() -> None:
    limits = set(LimitsSettings.model_fields)
    for engine in (TorchEngineSettings, TrtllmSettings):
        assert limits <= set(engine.model_fields)
        assert not set(engine.model_fields) & set(ServerSettings.model_fields)
    own = [set(c.model_fields) - limits for c in CONCERNS if c is not LimitsSettings]
    assert sum(map(len, own)) == len(set().union(*own))  # no knob in two concerns


def test_each_concern_checks_its_own_rules_alone() -> None:
    with pytest.raises(ValidationError, match="max_input_len must be below max_seq_len"):
        TorchEngineSettings(max_input_len=8, max_seq_len=8)
    with pytest.raises(ValidationError, match="probe_reserve_connections"):
        ServerSettings(max_connections=8, probe_reserve_connections=8)
    with pytest.raises(ValidationError, match="engine_stall_exit_seconds"):
        OpsSettings(engine_stall_unready_seconds=10, engine_stall_exit_seconds=5)


def test_env_names_are_matched_exactly_in_upper_case() -> None:
    s = Settings.load({}, env={"mtt_max_inflight": "3", "Mtt_Max_Waiting": "4"})
    assert (s.max_inflight, s.max_waiting) == (256, 512)
    with pytest.raises(SettingsError, match="did you mean MTT_MAX_INFLIGHT"):
        Settings.load({}, env={"MTT_max_inflight": "5"})
    assert Settings.load({}, env={"MTT_MAX_INFLIGHT": "3"}).max_inflight == 3


def test_the_environment_is_read_by_pydantic_settings_own_source() -> None:
    from pydantic_settings import EnvSettingsSource

    from mistral_serving.settings import _Environment

    assert issubclass(_Environment, EnvSettingsSource)
    assert _Environment(Settings, {"MTT_MAX_SEQ_LEN": "", "MTT_HOST": "::1"})() == {
        "max_seq_len": None,
        "host": "::1",
    }


def test_each_engine_takes_only_its_own_concern() -> None:
    """mypy then stops an engine from reading a knob of another concern (the server's,
    another engine's): their entry points are typed to take just theirs."""
    import inspect

    from mistral_gpu_fallback.process.client import ProcessEngine, wants_own_process
    from mistral_gpu_fallback.static.engine import StaticTorchEngine, load_static_model
    from mistral_serving.artifacts.artifact import load_artifact, open_artifact
    from mistral_serving.engines import factory
    from mistral_serving.engines.pytorch.dynamic import TorchEngine
    from mistral_serving.engines.trtllm.engine import TrtLlmEngine, scheduler_config
    from mistral_serving.engines.trtllm.pytorch_backend import TrtLlmPytorchEngine

    expected = {
        TorchEngineSettings: [
            TorchEngine.from_pretrained,
            TorchEngine.for_model,
            StaticTorchEngine.for_model,
            load_static_model,
            ProcessEngine.start,
            factory.start_torch_engine,
            factory.start_guided_torch_engine,
        ],
        GpuFallbackSettings: [wants_own_process],
        TrtllmSettings: [TrtLlmEngine.load, TrtLlmPytorchEngine.load, scheduler_config],
        ArtifactSettings: [load_artifact, open_artifact],
    }
    for concern, functions in expected.items():
        for function in functions:
            # The modules use postponed annotations: the annotation is the concern's name.
            annotation = inspect.signature(function).parameters["settings"].annotation
            assert annotation in (concern, concern.__name__), function
