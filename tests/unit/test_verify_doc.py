"""docs/verify-on-gpu.md against the code: the engine commands it shows are the golden
file's (generated into it), the defaults it states are EngineOptions', every verify-gpu
check has its row, the image tag is the deploy settings', and the one-command section
installs nothing by hand. `UPDATE_GOLDEN=1` rewrites the generated block."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from mistral_build.cli import build_parser
from mistral_build.deploy_settings import DeploySettings
from mistral_build.engine import EngineOptions, default_max_batch_size
from mistral_build.verify.checks import ANSWER_CHECKS
from mistral_build.verify.lifecycle import LIFECYCLE_CHECKS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "verify-on-gpu.md"
GOLDEN = REPO / "tests" / "golden" / "engine_commands"
BLOCK = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) [^\n]*-->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


def generated(name: str) -> str:
    """The golden file as the doc shows it: its commands, without the script preamble."""
    lines = (GOLDEN / f"{name}.sh").read_text().splitlines()
    body = [ln for ln in lines if not ln.startswith(("#!", "set -"))]
    return "```bash\n" + "\n".join(body) + "\n```\n"


def rendered(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + generated(m.group("name")) + m.group(4), text)


def test_the_engine_commands_shown_are_the_golden_files():
    text = DOC.read_text()
    assert BLOCK.search(text), "no generated block"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        DOC.write_text(rendered(text))
        text = DOC.read_text()
    assert text == rendered(text), "docs/verify-on-gpu.md drifted: UPDATE_GOLDEN=1 regenerates it"
    assert "--output_timing_cache" in generated("default_bf16_a100")


def test_a_drifted_block_is_found():
    text = DOC.read_text()
    drifted = text.replace("--max_batch_size 128", "--max_batch_size 64", 1)
    assert drifted != text and rendered(drifted) != drifted


def test_the_stated_defaults_are_the_builds():
    text = DOC.read_text()
    opts = EngineOptions(gpu="a100")
    batch = default_max_batch_size("a100", 40 * 1024)
    assert f"{opts.dtype}; tp1; max_batch_size={batch}; max_input_len={opts.max_input_len}" in text
    assert f"# 1.2.1 {batch} {opts.max_input_len} {opts.max_seq_len} {opts.max_num_tokens}" in text
    assert "float16;" not in text.replace("bfloat16;", "") and "A100 80GB" not in text


def test_every_check_has_its_row():
    rows = set(re.findall(r"^   \| `(\w+)`", DOC.read_text(), re.M))
    names = {n for n, _ in ANSWER_CHECKS + LIFECYCLE_CHECKS}
    names |= {"driver_vs_cuda", "tensorrt_llm_import", "build", "server_ready", "benchmark"}
    names |= {"drain_on_sigterm"}
    assert names <= rows, names - rows


def test_the_one_command_section_installs_nothing_by_hand_and_its_commands_parse():
    text = DOC.read_text()
    section = text[text.index("## One command") : text.index("It needs no download")]
    assert "pip install" not in section and "pip freeze" not in section
    tag = DeploySettings().image_tag
    assert f"$IMAGE:{tag}-verify" in section and f"$IMAGE:{tag}\n" in section
    image = next(ln for ln in section.splitlines() if ln.startswith("python build.py image"))
    args = shlex.split(image.split("#")[0])[2:]
    parsed = build_parser().parse_args([a.replace("$IMAGE", "r.example/x/y") for a in args])
    assert parsed.command == "image" and parsed.no_push
