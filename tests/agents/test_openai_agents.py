"""The OpenAI Agents SDK, unchanged, runs a two-step tool-calling agent (a forced call,
the tool's result, the final answer) against the real Truss server with the dev model:
with its chat completions model, and with its Responses API model (turns chained by
previous_response_id, and with the whole input resent each turn).
It lives in its own venv (`make test-agents` builds it from tests/agents/requirements.txt
and sets AGENTS_PYTHON): openai-agents needs starlette >= 1.3.1, which the server's
fastapi does not allow in the dev venv. Without AGENTS_PYTHON this is skipped."""

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

AGENTS_PYTHON = os.environ.get("AGENTS_PYTHON")
REPO = Path(__file__).resolve().parents[2]

needs_agents = pytest.mark.skipif(
    AGENTS_PYTHON is None, reason="openai-agents runs in its own venv: make test-agents"
)


@needs_agents
def test_the_pinned_version_is_the_one_that_runs() -> None:
    assert AGENTS_PYTHON is not None
    row = rows()["OpenAI Agents SDK"]
    code = f"import importlib.metadata as m; print(m.version({row.package!r}))"
    out = subprocess.run([AGENTS_PYTHON, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == row.version


@needs_agents
def test_an_agent_calls_the_tool_then_answers(server_url: str) -> None:
    before = answered(server_url)
    run_agent(rows()["OpenAI Agents SDK"].local(server_url))  # the README's command
    # Two chat requests were answered: the forced call, then the final answer.
    assert answered(server_url) - before == 2


@needs_agents
@pytest.mark.parametrize("resend", [False, True])
def test_an_agent_on_the_responses_api_calls_the_tool_then_answers(
    smollm2_url: str, resend: bool
) -> None:
    # A real model (tests/conftest.py's SmolLM2 server): the Agents SDK's Responses model
    # refuses an answer cut by its token limit (status incomplete), and the random-weight
    # dev model never ends a turn by itself.
    before = answered(smollm2_url, "responses")
    command = rows()["OpenAI Agents SDK (Responses)"].local(smollm2_url)  # the README's
    run_agent(command + (" --resend" if resend else ""))
    assert answered(smollm2_url, "responses") - before == 2


def run_agent(command: str) -> None:
    """Run the README's agent command in the agents venv; check what the agent did."""
    assert AGENTS_PYTHON is not None
    argv = shlex.split(command)
    assert argv[:2] == ["python", "tests/agents/agent_loop.py"]
    run = subprocess.run(
        [AGENTS_PYTHON, *argv[1:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["calls"] in (["Paris"], ["Lyon"])  # the forced call ran the tool once
    assert result["items"][:2] == ["ToolCallItem", "ToolCallOutputItem"]
    assert result["items"][-1] == "MessageOutputItem" and isinstance(result["final"], str)


def answered(url: str, route: str = "chat_completions") -> float:
    return sum(
        value(url, "mtt:request_finished_total", route=route, finished_reason=r)
        for r in ("stop", "length")
    )
