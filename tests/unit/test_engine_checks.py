"""Engine checks on crafted engine configs and directories (no GPU, no tensorrt_llm); the
config checks are fuzzed: any JSON as config.json is an EngineCheckError line or passes."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mistral_serving.artifacts.manifest import (
    ArtifactError,
    BuildManifest,
    GpuRecord,
    is_engine_config,
    write_manifest,
)
from mistral_serving.engines.base import EngineLimits
from mistral_serving.engines.trtllm import checks as ec
from mistral_serving.engines.trtllm.checks import EngineCheckError, GpuInfo

A100 = GpuInfo(name="NVIDIA A100-SXM4-40GB", capability="8.0", count=1)
H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", capability="9.0", count=1)


def engine_config(
    *,
    version: str | None = "1.2.1",
    tp: int = 1,
    pp: int = 1,
    world_size: int | None = None,
    build: dict | None = None,
) -> dict:
    mapping = {"tp_size": tp, "pp_size": pp}
    if world_size is not False:
        mapping["world_size"] = world_size if world_size is not None else tp * pp
    config = {
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float16",
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "mapping": mapping,
        },
        "build_config": build
        or {
            "max_batch_size": 64,
            "max_input_len": 4096,
            "max_seq_len": 8192,
            "max_num_tokens": 8192,
        },
    }
    if version is not None:
        config["version"] = version
    return config


def make_dir(
    tmp_path: Path,
    config: dict | str | None = None,
    ranks: int | None = None,
    capability: str | None = None,
) -> Path:
    d = tmp_path / "engine"
    d.mkdir()
    config = engine_config() if config is None else config
    text = config if isinstance(config, str) else json.dumps(config)
    (d / "config.json").write_text(text)
    if ranks is None:
        ranks = ec.world_size(config) if isinstance(config, dict) else 1
    for rank in range(ranks):
        (d / f"rank{rank}.engine").write_bytes(b"engine")
    if capability is not None:
        write_manifest(
            d,
            BuildManifest(
                kind="trtllm_engine",
                source_model="mistralai/Mistral-7B-Instruct-v0.2",
                gpu=GpuRecord(name="built on", compute_capability=capability),
            ),
        )
    return d


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


# -- config.json -----------------------------------------------------------------------


def test_missing_config_json(tmp_path):
    with pytest.raises(EngineCheckError) as exc:
        ec.read_engine_config(tmp_path)
    assert "config.json: missing" in one_line(exc)


def test_unparseable_config_json(tmp_path):
    d = make_dir(tmp_path, config='{"version": "1.2.1", ')
    with pytest.raises(ArtifactError) as exc:
        ec.read_engine_config(d)
    assert "not valid JSON" in one_line(exc)


def test_checkpoint_config_is_not_an_engine(tmp_path):
    hf_config = {"architectures": ["MistralForCausalLM"], "vocab_size": 32000}
    d = make_dir(tmp_path, config=hf_config, ranks=1)
    with pytest.raises(EngineCheckError) as exc:
        ec.read_engine_config(d)
    assert "pretrained_config" in one_line(exc)
    assert not is_engine_config(hf_config)


def test_is_engine_config():
    assert is_engine_config(engine_config())
    assert not is_engine_config({"pretrained_config": {}, "build_config": []})


# -- rank files ------------------------------------------------------------------------


def test_missing_rank_file(tmp_path):
    config = engine_config(tp=2)
    d = make_dir(tmp_path, config=config, ranks=1)
    with pytest.raises(EngineCheckError) as exc:
        ec.check_rank_files(d, config)
    message = one_line(exc)
    assert "rank1.engine: missing" in message and "2 rank(s)" in message


def test_empty_rank_file(tmp_path):
    config = engine_config()
    d = make_dir(tmp_path, config=config)
    (d / "rank0.engine").write_bytes(b"")
    with pytest.raises(EngineCheckError) as exc:
        ec.check_rank_files(d, config)
    assert "empty" in one_line(exc)


def test_all_rank_files_present(tmp_path):
    config = engine_config(tp=2, pp=2)
    ec.check_rank_files(make_dir(tmp_path, config=config), config)  # no error


def test_world_size_without_the_field_is_tp_times_pp():
    assert ec.world_size(engine_config(tp=2, pp=2, world_size=False)) == 4
    assert ec.world_size(engine_config(tp=2, world_size=2)) == 2


# -- TensorRT-LLM version ----------------------------------------------------------------


def test_version_mismatch():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_version(engine_config(version="1.2.0rc5"), installed="1.2.1")
    message = one_line(exc)
    assert "1.2.0rc5" in message and "1.2.1" in message


def test_version_match():
    ec.check_version(engine_config(version="1.2.1"), installed="1.2.1")


def test_version_missing_from_config():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_version(engine_config(version=None), installed="1.2.1")
    assert "no `version`" in one_line(exc)


def test_tensorrt_llm_not_installed():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_version(engine_config(version="1.2.1"), installed=None)
    assert "not installed" in one_line(exc)


# -- GPU architecture and count --------------------------------------------------------------


def test_arch_mismatch():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_gpu_arch("9.0", A100)
    message = one_line(exc)
    assert "9.0" in message and "8.0" in message and "A100" in message


def test_arch_match():
    ec.check_gpu_arch("8.0", A100)


def test_arch_unknown_without_manifest_passes():
    ec.check_gpu_arch(None, A100)


def test_no_gpu():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_gpu_arch("8.0", None)
    assert "no CUDA GPU" in one_line(exc)


def test_more_ranks_than_gpus():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_world_size(engine_config(tp=2), gpu_count=1)
    message = one_line(exc)
    assert "2 GPUs" in message and "1 visible" in message


def test_enough_gpus():
    ec.check_world_size(engine_config(tp=2), gpu_count=2)
    ec.check_world_size(engine_config(tp=1), gpu_count=8)


# -- limits --------------------------------------------------------------------------------


def test_limits_from_config():
    assert ec.limits_from_config(engine_config()) == EngineLimits(4096, 8192, 64)


def test_limits_without_max_input_len_use_max_seq_len():
    config = engine_config(build={"max_batch_size": 8, "max_seq_len": 2048})
    assert ec.limits_from_config(config) == EngineLimits(2048, 2048, 8)


def test_limits_clip_input_to_sequence():
    config = engine_config(build={"max_batch_size": 8, "max_input_len": 9000, "max_seq_len": 4096})
    assert ec.limits_from_config(config).max_input_len == 4096


@pytest.mark.parametrize(
    ("build", "named"),
    [
        ({"max_input_len": 1024, "max_seq_len": 2048}, "max_batch_size"),
        ({"max_batch_size": "8", "max_seq_len": 2048}, "max_batch_size"),  # no coercion
        ({"max_batch_size": 8, "max_seq_len": -1}, "max_seq_len"),
        ({"max_batch_size": True, "max_seq_len": 2048}, "max_batch_size"),
    ],
)
def test_limits_invalid_field(build, named):
    with pytest.raises(EngineCheckError) as exc:
        ec.limits_from_config(engine_config(build=build))
    assert named in one_line(exc)


@pytest.mark.parametrize(
    ("max_input_len", "max_seq_len", "named"),
    [(4097, None, "max_input_len"), (None, 8193, "max_seq_len"), (5000, 9000, "max_input_len")],
)
def test_settings_above_engine_limits(max_input_len, max_seq_len, named):
    with pytest.raises(EngineCheckError) as exc:
        ec.check_limits(EngineLimits(4096, 8192, 64), max_input_len, max_seq_len)
    assert f"setting {named}=" in one_line(exc)


def test_settings_within_engine_limits():
    ec.check_limits(EngineLimits(4096, 8192, 64), 4096, 8192)
    ec.check_limits(EngineLimits(4096, 8192, 64), 100, None)
    ec.check_limits(EngineLimits(4096, 8192, 64))


def test_tokenizer_larger_than_engine_vocab():
    with pytest.raises(EngineCheckError) as exc:
        ec.check_vocab(engine_config(), tokenizer_vocab_size=32768)
    assert "32768" in one_line(exc)
    ec.check_vocab(engine_config(), tokenizer_vocab_size=32000)


# -- everything together -------------------------------------------------------------------


def check(d, config=None, capability="8.0", **kwargs):
    """check_engine as the TensorRT-LLM engine runs it: config.json as load_artifact parsed it."""
    config = engine_config() if config is None else config
    return ec.check_engine(d, config, capability, **kwargs)


def test_check_engine_passes_and_returns_limits(tmp_path):
    d = make_dir(tmp_path)
    limits = check(d, installed_version="1.2.1", gpu=A100, max_seq_len=4096)
    assert limits == EngineLimits(4096, 8192, 64)


def test_check_engine_without_manifest_skips_arch(tmp_path):
    check(make_dir(tmp_path), capability=None, installed_version="1.2.1", gpu=H100)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"installed_version": "1.1.0", "gpu": A100}, "TensorRT-LLM 1.2.1"),
        ({"installed_version": "1.2.1", "gpu": None}, "no CUDA GPU"),
        ({"installed_version": "1.2.1", "gpu": H100}, "compute capability 8.0"),
        ({"installed_version": "1.2.1", "gpu": A100, "max_input_len": 5000}, "max_input_len"),
        ({"installed_version": "1.2.1", "gpu": A100, "tokenizer_vocab_size": 40000}, "vocab"),
    ],
)
def test_check_engine_runs_each_check(tmp_path, kwargs, expected):
    d = make_dir(tmp_path)
    with pytest.raises(EngineCheckError, match=expected):
        check(d, **kwargs)


def test_check_engine_counts_gpus(tmp_path):
    config = engine_config(tp=2)
    d = make_dir(tmp_path, config=config)
    with pytest.raises(EngineCheckError, match="2 GPUs"):
        check(d, config, installed_version="1.2.1", gpu=A100)
    two = GpuInfo(A100.name, A100.capability, 2)
    check(d, config, installed_version="1.2.1", gpu=two)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["pretrained_config", "build_config", "version"]),
    st.sampled_from(["mapping", "vocab_size", "max_batch_size", "max_seq_len", "max_input_len"]),
    json_values,
)
def test_fuzz_config_values(tmp_path_factory, section, key, value):
    """Any JSON value anywhere in config.json: the checks pass or raise one EngineCheckError
    line, never a TypeError/KeyError/OverflowError from deep inside."""
    config = engine_config()
    if section == "version" or not isinstance(config.get(section), dict):
        config[section] = value
    else:
        config[section][key] = value
    d = tmp_path_factory.mktemp("fuzz")
    (d / "rank0.engine").write_bytes(b"e")
    try:
        check(d, config, installed_version="1.2.1", gpu=A100, tokenizer_vocab_size=32000)
    except EngineCheckError as exc:
        assert str(exc) and "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_fuzz_whole_config(value):
    config = value if isinstance(value, dict) else {"pretrained_config": value}
    try:
        ec.check_engine_config(config, "config.json")
        ec.world_size(config)
        ec.limits_from_config(config)
        ec.check_vocab(config, 32000)
    except EngineCheckError as exc:
        assert str(exc) and "\n" not in str(exc)


# -- GPU detection -------------------------------------------------------------------------


def fake_torch(available: bool, count: int = 0, capability=(8, 0), name="NVIDIA A100"):
    cuda = types.SimpleNamespace(
        is_available=lambda: available,
        device_count=lambda: count,
        get_device_capability=lambda i: capability,
        get_device_name=lambda i: name,
    )
    return types.SimpleNamespace(cuda=cuda)


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError


class FakeNvml(types.ModuleType):
    """The pynvml (nvidia-ml-py) calls detect_gpu makes. Like NVML, it ignores
    CUDA_VISIBLE_DEVICES; it counts inits and shutdowns."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[str, str, tuple[int, int]]], driver: bool = True):
        super().__init__("pynvml")
        self.gpus, self.driver, self.inits, self.shutdowns = gpus, driver, 0, 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if not self.driver:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        for i, (_, gpu_uuid, _) in enumerate(self.gpus):
            if gpu_uuid == uuid:
                return i
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self.gpus[handle][0]

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802
        return self.gpus[handle][2]


NVML_A100 = ("NVIDIA NVML_A100-SXM4-40GB", "GPU-aaaa", (8, 0))
NVML_H200 = ("NVIDIA NVML_H200", "GPU-hhhh", (9, 0))


def test_detect_gpu_reads_nvml_and_never_touches_torch_cuda(monkeypatch):
    nvml = FakeNvml([NVML_A100, NVML_H200])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setitem(sys.modules, "torch", None)  # a CUDA context would need torch
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert ec.detect_gpu() == GpuInfo(name=NVML_A100[0], capability="8.0", count=2)
    assert nvml.inits == nvml.shutdowns == 1


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1", GpuInfo(name=NVML_H200[0], capability="9.0", count=1)),
        ("GPU-hhhh,0", GpuInfo(name=NVML_H200[0], capability="9.0", count=2)),
        ("1,7,0", GpuInfo(name=NVML_H200[0], capability="9.0", count=1)),  # CUDA stops at 7
        ("", None),
        ("-1", None),
        ("GPU-none", None),
    ],
)
def test_detect_gpu_follows_cuda_visible_devices(monkeypatch, visible, expected):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([NVML_A100, NVML_H200]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert ec.detect_gpu() == expected


def test_detect_gpu_without_a_driver_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([NVML_A100], driver=False))
    assert ec.detect_gpu() is None


def test_detect_gpu_on_cpu(monkeypatch, no_nvml):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(False))
    assert ec.detect_gpu() is None


def test_detect_gpu_without_torch(monkeypatch, no_nvml):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    assert ec.detect_gpu() is None


def test_detect_gpu_reads_torch_cuda_only_without_nvml(monkeypatch, no_nvml):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(True, 2, (9, 0), "NVIDIA H100"))
    assert ec.detect_gpu() == GpuInfo(name="NVIDIA H100", capability="9.0", count=2)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    visible=st.lists(
        st.one_of(
            st.integers(-2, 4).map(str),
            st.sampled_from(["GPU-aaaa", "GPU-hhhh", "GPU-x", "MIG-1", "", " 1", "0x1"]),
            st.text(
                st.characters(blacklist_characters=",\x00", blacklist_categories=("Cs",)),
                max_size=6,
            ),
        ),
        max_size=5,
    ).map(",".join)
)
@example("¹")  # a digit to str.isdigit, not to int()
@example("0,٣")
def test_fuzz_cuda_visible_devices(monkeypatch, visible):
    """Any CUDA_VISIBLE_DEVICES: an answer, never an exception, never more GPUs than listed."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([NVML_A100, NVML_H200]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    info = ec.detect_gpu()
    assert info is None or (
        info.name in (NVML_A100[0], NVML_H200[0]) and 1 <= info.count <= len(visible.split(","))
    )
