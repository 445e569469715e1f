"""AIPerf (NVIDIA's successor of genai-perf), unchanged, runs the README's command against
the real Truss server with the dev model. It lives in the tools venv (`make test-tools`
builds it and sets AIPERF); without AIPERF this is skipped."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from urllib.request import urlopen

import pytest

from tests.e2e.util import value
from tests.works_with import rows

pytestmark = pytest.mark.e2e

AIPERF = os.environ.get("AIPERF")
REPO = Path(__file__).resolve().parents[2]
# AIPerf's offline mode (HF_HUB_OFFLINE) only loads tokenizers from the Hub's cache, not
# from a folder, so it runs online with every proxy pointed at a closed loopback port:
# nothing can leave the machine, and the server (loopback) is reached directly.
NO_NETWORK = {
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
    "HF_DATASETS_OFFLINE": "1",
}

needs_aiperf = pytest.mark.skipif(
    AIPERF is None, reason="AIPerf runs in its own venv: make test-tools"
)


@needs_aiperf
def test_the_pinned_version_runs() -> None:
    out = subprocess.run([AIPERF, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == rows()["AIPerf"].version


@needs_aiperf
def test_aiperf_profile_completes_every_request(server_url: str, tmp_path: Path) -> None:
    argv = shlex.split(rows()["AIPerf"].local(server_url))
    assert argv[:2] == ["aiperf", "profile"]
    argv = [AIPERF, *argv[1:], "--artifact-dir", str(tmp_path)]
    finished = (
        "mtt:request_finished_total",
        {"route": "chat_completions", "finished_reason": "length"},
    )
    before = value(server_url, finished[0], **finished[1])
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    run = subprocess.run(
        argv, cwd=REPO, env=env | NO_NETWORK, capture_output=True, text=True, timeout=400
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert report["is_complete"] and not report["was_cancelled"]
    assert report["error_summary"] == []
    assert report["request_count"]["avg"] == 4
    # What the server reported in each answer's usage: exactly the tokens asked for.
    assert report["usage_completion_tokens"]["min"] == report["usage_completion_tokens"]["max"] == 8
    assert report["time_to_first_token"]["min"] > 0
    records = [
        json.loads(line) for line in (tmp_path / "profile_export.jsonl").read_text().splitlines()
    ]
    assert len(records) == 4 and all(r["metadata"]["x_request_id"] for r in records)
    assert value(server_url, finished[0], **finished[1]) == before + 4
    # AIPerf scrapes the server's /metrics beside the run, and finds it.
    scraped = json.loads((tmp_path / "server_metrics_export.json").read_text())["summary"]
    assert scraped["endpoints_successful"] == [f"{server_url}/metrics"]


@needs_aiperf
def test_aiperf_sends_the_benchmarks_token_id_bodies(
    server_url: str, dev_model: Path, tmp_path: Path
) -> None:
    """bench/clients.py's AIPerf level with `token_ids`: AIPerf replays our client's
    token-id bodies verbatim (its inputs_json dataset), so the second client measures the
    same requests as ours; every one is answered with the prompt length asked for."""
    from bench.gpu import clients

    model = json.loads(urlopen(f"{server_url}/v1/models").read())["data"][0]["id"]
    payloads = clients.aiperf_token_id_payloads(tmp_path / "inputs.json", model, 2, 16, 4)
    bodies = [s["payloads"][0] for s in json.loads(payloads.read_text())["data"]]
    assert len(bodies) == 6 and all(len(b["prompt"]) == 16 for b in bodies)
    argv = clients.aiperf_command(
        server_url, model, str(dev_model), 2, 16, 4, tmp_path / "out", payloads=payloads
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    argv[0] = str(Path(str(AIPERF)).parent / "python")  # the tools venv's, as AIPERF_PY
    run = subprocess.run(
        argv, cwd=REPO, env=env | NO_NETWORK, capture_output=True, text=True, timeout=400
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "profile_export_aiperf.json").read_text())
    assert report["is_complete"] and report["error_summary"] == []
    assert report["request_count"]["avg"] == 4
    assert report["usage_prompt_tokens"]["min"] == report["usage_prompt_tokens"]["max"] == 16
    assert report["usage_completion_tokens"]["min"] == report["usage_completion_tokens"]["max"] == 4
