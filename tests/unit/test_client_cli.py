"""`python -m client` as a user runs it (subprocess) against the loopback fake, and the
request bodies the library builds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.errors import ClientError
from client.protocol import build_request, parse_completion
from client.testing import DEFAULT_TOKENS, FakeServer, FakeServerState
from client.types import SamplingParams

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "client", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        input=stdin,
        timeout=60,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


def expected(n: int) -> str:
    return "".join(DEFAULT_TOKENS[i % len(DEFAULT_TOKENS)] for i in range(n))


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_stream_prints_text(fake: FakeServer, api: str) -> None:
    res = cli(
        "What is a mistral?",
        "--stream",
        "--url",
        fake.url,
        "--api",
        api,
        "--max-new-tokens",
        "10",
        "--seed",
        "3",
        "--streaming-interval",
        "1",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected(10) + "\n"


def test_json_output_and_every_sampling_flag(fake: FakeServer) -> None:
    res = cli(
        "hello there",
        "--url",
        fake.url,
        "--json",
        "--max-new-tokens",
        "4",
        "--temperature",
        "0.5",
        "--top-k",
        "5",
        "--top-p",
        "0.9",
        "--stop",
        "END",
        "--stop",
        "STOP",
        "--seed",
        "7",
        "--repetition-penalty",
        "1.1",
        "--presence-penalty",
        "0.2",
        "--frequency-penalty",
        "0.3",
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out == {
        "output": expected(4),
        "finish_reason": "length",
        "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
    }
    body = fake.state.requests[-1]
    assert body == {
        "prompt": "hello there",
        "max_new_tokens": 4,
        "temperature": 0.5,
        "top_k": 5,
        "top_p": 0.9,
        "stop": ["END", "STOP"],
        "seed": 7,
        "repetition_penalty": 1.1,
        "presence_penalty": 0.2,
        "frequency_penalty": 0.3,
        "streaming": False,
    }


def test_stream_json_has_usage_on_openai(fake: FakeServer) -> None:
    res = cli(
        "hi", "--stream", "--json", "--api", "openai", "--url", fake.url, "--max-new-tokens", "3"
    )
    out = json.loads(res.stdout)
    assert out["output"] == expected(3) and out["usage"]["completion_tokens"] == 3
    assert out["ttft_s"] <= out["e2e_s"]


def test_chat_with_system_and_stdin(fake: FakeServer) -> None:
    res = cli(
        "-", "--system", "be brief", "--url", fake.url, "--max-new-tokens", "2", stdin="from stdin"
    )
    assert res.returncode == 0 and res.stdout == expected(2) + "\n"
    assert fake.state.requests[-1]["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "from stdin"},
    ]


def test_server_error_message_and_exit_code(fake: FakeServer) -> None:
    res = cli("x", "--url", fake.url, "--temperature", "-1")
    assert res.returncode == 1
    assert "HTTP 400: temperature must be >= 0, got -1.0" in res.stderr


def test_build_request_bodies() -> None:
    s = SamplingParams(max_new_tokens=5, top_k=1, streaming_interval=2, stop=["x"])
    p = build_request("predict", prompt="hi", sampling=s, stream=True)
    assert p.path == "/v1/models/model:predict"
    assert p.body == {
        "prompt": "hi",
        "max_new_tokens": 5,
        "top_k": 1,
        "streaming_interval": 2,
        "stop": ["x"],
        "streaming": True,
    }
    o = build_request(
        "openai", messages=[{"role": "user", "content": "hi"}], sampling=s, stream=True, model="m"
    )
    assert o.path == "/v1/chat/completions" and o.chat
    assert o.body == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "top_k": 1,
        "stop": ["x"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    c = build_request("openai", prompt="hi", stream=False)
    assert c.path == "/v1/completions" and "stream_options" not in c.body
    with pytest.raises(ValueError):
        build_request("predict", prompt="a", messages=[])
    with pytest.raises(ValueError):
        build_request("tgi", prompt="a")  # type: ignore[arg-type]


def test_parse_completion_shapes() -> None:
    spec = build_request("openai", messages=[{"role": "user", "content": "q"}])
    done = parse_completion(
        spec,
        {
            "choices": [{"message": {"content": "A"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1},
        },
    )
    assert (done.output, done.finish_reason, done.usage.total_tokens) == ("A", "stop", 3)
    with pytest.raises(ClientError, match="output"):
        parse_completion(build_request("predict", prompt="q"), {"echo": {}})


# -- defaults and --json --stream on every route (in-process: main() as the CLI runs it) --


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict | str, str]:
    from client.cli import main

    code = main(list(args))
    captured = capsys.readouterr()
    try:
        return code, json.loads(captured.out), captured.err
    except ValueError:
        return code, captured.out, captured.err


def test_default_length_is_short(fake: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    from client.cli import DEFAULT_MAX_NEW_TOKENS

    code, out, _ = run_main(capsys, "hi", "--url", fake.url, "--json")
    assert code == 0 and DEFAULT_MAX_NEW_TOKENS == 256
    assert fake.state.requests[-1]["max_new_tokens"] == 256
    assert out["usage"]["completion_tokens"] == 256


def test_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    from client.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for shown in ("(default: 256)", "(default: predict)", "(default: 600.0)", "(default: 3)"):
        assert shown in out


def test_predict_stream_json_reports_how_it_ended(
    fake: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(
        capsys, "hi", "--url", fake.url, "--stream", "--json", "--max-new-tokens", "4"
    )
    assert code == 0
    assert out["output"] == expected(4) and out["finish_reason"] == "complete"
    assert out["usage"] is None and "--tokenizer" in out["usage_note"]


def test_predict_stream_json_counts_tokens_with_a_local_tokenizer(
    fake: FakeServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tokenizer.json"))
    code, out, _ = run_main(
        capsys, "hi", "--url", fake.url, "--stream", "--json", "--max-new-tokens", "6",
        "--tokenizer", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    assert out["usage"] == {
        "prompt_tokens": None,
        "completion_tokens": len(expected(6).split()),
        "total_tokens": None,
        "counted_by": "client tokenizer",
    }
    code, _, err = run_main(
        capsys, "hi", "--url", fake.url, "--stream", "--json", "--tokenizer", str(tmp_path / "no")
    )
    assert code == 1 and "cannot load tokenizer" in err


@pytest.mark.parametrize("api", ["predict", "openai"])
def test_stream_json_reports_a_broken_stream_as_truncated(
    api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeServer(FakeServerState(chunked=True, truncate_after=2)) as cut:
        code, out, _ = run_main(
            capsys, "hi", "--url", cut.url, "--api", api, "--stream", "--json",
            "--max-new-tokens", "5", "--streaming-interval", "1",
        )  # fmt: skip
    assert code == 1
    assert out["finish_reason"] == "truncated" and out["output"] == expected(2)
    assert "broke off" in out["error"] or "DONE" in out["error"]


def test_openai_stream_json_has_the_servers_finish_reason_and_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with FakeServer(FakeServerState(chunked=True)) as fake:
        for chat in ([], ["--chat"]):
            code, out, _ = run_main(
                capsys, "hi", "--url", fake.url, "--api", "openai", "--stream", "--json",
                "--max-new-tokens", "3", *chat,
            )  # fmt: skip
            assert code == 0 and out["finish_reason"] == "length"
            assert out["usage"]["completion_tokens"] == 3 and "usage_note" not in out


@pytest.mark.parametrize("mode", [[], ["--stream"], ["--stream", "--json"], ["--json"]])
def test_an_empty_answer_is_never_a_silent_success(mode: list[str]) -> None:
    with FakeServer(FakeServerState(tokens=("",))) as empty:
        res = cli("What is the capital of France?", "--url", empty.url, *mode)
        chat = cli("What is the capital of France?", "--chat", "--url", empty.url, *mode)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "no text" in res.stderr and "--chat" in res.stderr
    assert chat.returncode == 1 and "no text" in chat.stderr and "--chat" not in chat.stderr


@pytest.mark.parametrize(
    "args",
    [["hi", "--chat"], ["hi", "--chat", "--stream"], ["bench", "--num-prompts", "2"]],
    ids=["predict", "stream", "bench"],
)
def test_no_server_there_says_how_to_name_another_port(args: list[str]) -> None:
    """After `PORT=8081 make serve` the client and the benchmark still call 8080: the
    error says where the address is set. (Port 9 on loopback refuses connections.)"""
    res = cli(*args, "--url", "http://127.0.0.1:9", "--retries", "0")
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot reach http://127.0.0.1:9/"), last
    assert "--url http://127.0.0.1:8081" in last and "PORT=8081 make serve" in last
