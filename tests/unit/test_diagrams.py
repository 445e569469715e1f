"""docs/images/: the pipeline and drain pictures are drawn by mistral_build/diagrams.py from
the deployment's real numbers, and the committed PNGs are drawn from the current ones
(each PNG records a digest of its inputs; pixels differ between matplotlib versions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from mistral_build import diagrams
from mistral_build.paths import K8S_DIR


def source_of(path: Path) -> str | None:
    with Image.open(path) as img:
        assert img.format == "PNG"
        return img.text.get("Source")


@pytest.mark.parametrize("name", [diagrams.PIPELINE_PNG, diagrams.DRAIN_PNG])
def test_committed_pictures_are_drawn_from_the_current_inputs(name: str) -> None:
    path = diagrams.IMAGES_DIR / name
    assert source_of(path) == diagrams.inputs_digest(), (
        f"{path} is stale: run python -m mistral_build.diagrams"
    )


def test_the_script_draws_both_pictures(tmp_path: Path) -> None:
    paths = diagrams.write_all(tmp_path)
    assert [p.name for p in paths] == [diagrams.PIPELINE_PNG, diagrams.DRAIN_PNG]
    for p in paths:
        assert source_of(p) == diagrams.inputs_digest()
        with Image.open(p) as img:
            assert img.size[0] > 1000


def test_the_timeline_shows_the_manifests_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    values = diagrams.inputs()
    dep = yaml.safe_load((K8S_DIR / "deployment.yaml").read_text())
    spec = dep["spec"]["template"]["spec"]
    assert values["grace_s"] == spec["terminationGracePeriodSeconds"]
    assert (
        str(values["pre_stop_s"])
        == spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1]
    )
    assert values["grace_s"] == values["pre_stop_s"] + values["drain_s"] + values["margin_s"]
    # Another number, another digest: a stale picture is noticed.
    before = diagrams.inputs_digest()
    monkeypatch.setattr(diagrams, "inputs", lambda: {**values, "drain_s": 30})
    assert diagrams.inputs_digest() != before
