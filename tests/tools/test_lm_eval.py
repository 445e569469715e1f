"""lm-evaluation-harness, unchanged, runs the README's `local-completions` command against
the real Truss server with the dev model, on two tasks shipped in tests/tools/lm_eval (no
dataset download): a multiple-choice task scored by log-likelihood (echo + logprobs on
/v1/completions) and a generation task. It lives in the tools venv (`make test-tools`
builds it and sets LM_EVAL); without LM_EVAL this is skipped."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import requests

from tests.e2e.util import value
from tests.works_with import rows

pytestmark = pytest.mark.e2e

LM_EVAL = os.environ.get("LM_EVAL")
REPO = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
QUESTIONS = 4
CHOICES = 4

needs_lm_eval = pytest.mark.skipif(
    LM_EVAL is None, reason="lm-eval runs in its own venv: make test-tools"
)


@needs_lm_eval
def test_the_pinned_version_is_installed() -> None:
    out = subprocess.run(
        [str(Path(LM_EVAL).with_name("python")), "-c", "import importlib.metadata as m; print(m.version('lm_eval'))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == rows()["lm-evaluation-harness"].version


def samples(out: Path, task: str) -> list[dict]:
    (path,) = out.rglob(f"samples_{task}_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@needs_lm_eval
def test_local_completions_runs_both_shipped_tasks(server_url: str, tmp_path: Path) -> None:
    argv = shlex.split(rows()["lm-evaluation-harness"].local(server_url))
    assert argv[:2] == ["lm-eval", "run"]
    argv = [LM_EVAL, *argv[1:], "--output_path", str(tmp_path), "--log_samples"]
    counted = ("mtt:request_finished_total", "completions")
    before = sum(
        value(server_url, counted[0], route=counted[1], finished_reason=r)
        for r in ("stop", "length")
    )
    run = subprocess.run(
        argv, cwd=REPO, env=os.environ | OFFLINE, capture_output=True, text=True, timeout=500
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (results,) = tmp_path.rglob("results_*.json")
    found = json.loads(results.read_text())["results"]
    assert (
        found["mtt_capitals_mc"]["sample_len"]
        == found["mtt_capitals_gen"]["sample_len"]
        == QUESTIONS
    )
    # One request per choice (log-likelihood) and one per question (generation), all served.
    after = sum(
        value(server_url, counted[0], route=counted[1], finished_reason=r)
        for r in ("stop", "length")
    )
    assert after == before + QUESTIONS * CHOICES + QUESTIONS
    # What local-completions sends (lm_eval/models/api_models.py, openai_completions.py):
    # token ids from the tokenizer named in --model_args, without BOS (add_bos_token is
    # off); so the same ids, sent directly, must give the same figures.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(REPO / ".cache" / "dev-model"))

    def ids(text: str) -> list[int]:
        return hf.encode(text, add_special_tokens=False)

    def completion(body: dict) -> dict:
        r = requests.post(f"{server_url}/v1/completions", json={"model": "m"} | body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    for sample in samples(tmp_path, "mtt_capitals_mc"):
        scores = [float(resp[0][0]) for resp in sample["resps"]]
        assert len(scores) == CHOICES and all(math.isfinite(s) and s < 0 for s in scores)
        for score, arguments in zip(scores, sample["arguments"].values(), strict=True):
            context, continuation = arguments["arg_0"], arguments["arg_1"]
            whole, context_ids = ids(context + continuation), ids(context)  # _encode_pair
            echoed = completion(
                {"prompt": whole, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
            )
            # parse_logprobs: the continuation's logprobs, less the one generated token
            expected = sum(echoed["logprobs"]["token_logprobs"][len(context_ids) : -1])
            assert score == pytest.approx(expected, abs=1e-4)
    for sample in samples(tmp_path, "mtt_capitals_gen"):
        prompt = sample["arguments"]["gen_args_0"]["arg_0"]
        direct = completion(
            {"prompt": ids(prompt), "max_tokens": 8, "temperature": 0, "stop": ["\n"]}
        )
        assert sample["filtered_resps"][0] == direct["text"]  # the server's greedy answer
