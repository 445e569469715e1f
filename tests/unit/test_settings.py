"""Settings.load: model_metadata values, MTT_* overrides, refusals naming the field."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_serving.settings import ENV_PREFIX, Settings, SettingsError


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


def test_unknown_env_vars_ignored() -> None:
    s = Settings.load({}, env={"MTT_NOT_A_SETTING": "x", "PATH": "/bin", "ARTIFACT": "no"})
    assert s == Settings()


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
        ({}, {"MTT_HTTP_PARSER": "http2"}, "http_parser"),
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
@given(value=st.integers(1, 10**6), via_env=st.booleans())
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
