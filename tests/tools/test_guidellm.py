"""guidellm (vLLM's recommended load tool), unchanged, runs the README's benchmark
command against the real Truss server with the dev model. It lives in its own venv
(`make test-tools` builds it and sets GUIDELLM); without GUIDELLM this is skipped."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.e2e.util import value
from tests.works_with import rows

pytestmark = pytest.mark.e2e

GUIDELLM = os.environ.get("GUIDELLM")
REPO = Path(__file__).resolve().parents[2]
# No hub, ever: the tokenizer is the dev model's folder, the data synthetic.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

needs_guidellm = pytest.mark.skipif(
    GUIDELLM is None, reason="guidellm runs in its own venv: make test-tools"
)


@needs_guidellm
def test_the_pinned_version_runs() -> None:
    out = subprocess.run([GUIDELLM, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["guidellm", "version:", rows()["guidellm"].version]


@needs_guidellm
def test_guidellm_benchmark_completes_every_request(server_url: str, tmp_path: Path) -> None:
    row = rows()["guidellm"]
    argv = shlex.split(row.local(server_url))
    assert argv[0] == "guidellm"
    report = tmp_path / "report.json"
    argv = [
        GUIDELLM,
        *argv[1:],
        "--output",
        f"kind=json,path={report}",
        "--disable-console-interactive",
    ]
    finished = (
        "mtt:request_finished_total",
        {"route": "chat_completions", "finished_reason": "length"},
    )
    before = value(server_url, finished[0], **finished[1])
    run = subprocess.run(
        argv, cwd=REPO, env=os.environ | OFFLINE, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (bench,) = json.loads(report.read_text())["benchmarks"]
    requests = bench["requests"]
    assert (len(requests["errored"]), len(requests["incomplete"])) == (0, 0), requests["errored"][
        :1
    ]
    assert len(requests["successful"]) == 4
    for done in requests["successful"]:
        sent = json.loads(done["request_args"])["body"]
        # What guidellm asks of a vLLM server, all accepted and honoured.
        assert sent["ignore_eos"] is True and sent["stream"] is True
        assert sent["stream_options"]["continuous_usage_stats"] is True
        assert done["output_tokens"] == sent["max_completion_tokens"] == 8
        assert done["prompt_tokens"] > 16  # 16 synthetic tokens inside the chat template
        assert done["time_to_first_token_ms"] > 0
    assert value(server_url, finished[0], **finished[1]) == before + 4
