"""config.yaml's generated block: python_version, base_image, resources and model_metadata
come from the deploy settings and the TensorRT-LLM release, and the committed file is
exactly what they render."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from mistral_build import image, truss_config
from mistral_build.cli import main as build_main
from mistral_build.deploy_settings import DeploySettings
from mistral_build.paths import TRUSS_DIR
from mistral_serving.settings import Settings


def test_committed_config_is_what_the_defaults_render() -> None:
    assert truss_config.drift(DeploySettings()) == ""
    assert build_main(["truss-config", "--check"]) == 0


def test_generated_values_follow_their_sources() -> None:
    cfg = truss_config.truss_config()
    s = DeploySettings()
    assert cfg["base_image"] == {
        "image": image.BASE_IMAGE,
        "python_executable_path": image.BASE_IMAGE_PYTHON,
    }
    assert cfg["python_version"] == "py" + image.BASE_IMAGE_PYTHON_VERSION.replace(".", "")
    assert cfg["resources"] == {
        "accelerator": s.truss_accelerator,
        "use_gpu": True,
        "cpu": s.cpu_request,
        "memory": s.memory_request,
    }
    # No serving default is repeated: Settings holds them all.
    assert cfg["model_metadata"] == {}
    assert Settings.load(cfg["model_metadata"], env={}) == Settings()


def test_model_metadata_holds_only_what_differs_from_settings_defaults() -> None:
    default_inflight = str(Settings().max_inflight)
    s = DeploySettings(
        serving={"max_inflight": default_inflight, "max_waiting": "7", "log_prompts": "true"}
    )
    assert s.model_metadata() == {"max_waiting": 7, "log_prompts": True}
    loaded = Settings.load(s.model_metadata(), env={})
    assert (loaded.max_waiting, loaded.log_prompts) == (7, True)


@pytest.fixture
def truss_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "truss"
    shutil.copytree(TRUSS_DIR, dst, ignore=shutil.ignore_patterns("__pycache__", "packages"))
    return dst


def test_drift_is_detected_and_the_rest_of_the_file_is_kept(truss_copy: Path) -> None:
    path = truss_copy / "config.yaml"
    text = path.read_text()
    path.write_text(text.replace("accelerator: A100", "accelerator: L4"))
    assert "accelerator: L4" in truss_config.drift(DeploySettings(), truss_copy)
    h100 = DeploySettings(gpu_type="h100", gpu_count=4)
    truss_config.write_config(h100, truss_copy)
    written = path.read_text()
    assert yaml.safe_load(written)["resources"]["accelerator"] == "H100:4"
    head = text.split(truss_config.BEGIN)[0]
    assert written.startswith(head)  # hand-written keys and comments untouched
    assert truss_config.drift(h100, truss_copy) == ""


@pytest.mark.parametrize("damage", ["drop_begin", "drop_end", "twice"])
def test_a_config_without_exactly_one_block_is_refused(truss_copy: Path, damage: str) -> None:
    path = truss_copy / "config.yaml"
    text = path.read_text()
    if damage == "drop_begin":
        text = text.replace(truss_config.BEGIN, "")
    elif damage == "drop_end":
        text = text.replace(truss_config.END, "")
    else:
        text += text[text.index(truss_config.BEGIN) :]
    path.write_text(text)
    with pytest.raises(truss_config.TrussConfigError, match="exactly one generated block"):
        truss_config.write_config(DeploySettings(), truss_copy)
