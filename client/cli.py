"""`python -m client "What is a mistral?" --stream` and `python -m client bench ...`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from client.client import DEFAULT_URL, Client
from client.errors import ClientError, StreamError, unreachable_hint
from client.helpformat import HelpFormatter
from client.types import Message, SamplingParams

USAGE_HINT = "python -m client PROMPT [options]  |  python -m client bench --help"
# Short by default: a first try should answer in seconds, not generate 2,048 tokens.
DEFAULT_MAX_NEW_TOKENS = 256
EMPTY_ANSWER_NOTE = (
    "the server answered with no text (finish_reason: {reason}). A chat model given a plain "
    "prompt often ends at once: add --chat to send it as a user message"
)
PREDICT_STREAM_USAGE_NOTE = (
    "the predict route streams text only, without token counts: pass --tokenizer to count "
    "completion tokens here, or drop --stream (or use --api openai) for the server's usage"
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client",
        description="Generate with the mistral-trt-truss server (or any OpenAI-compatible "
        "server with --api openai). Benchmark: python -m client bench --help",
        formatter_class=HelpFormatter,
    )
    p.add_argument("prompt", help="the prompt ('-' reads it from stdin)")
    p.add_argument("--url", default=DEFAULT_URL, help="server base URL")
    p.add_argument(
        "--api",
        choices=["predict", "openai"],
        default="predict",
        help="predict: POST /v1/models/model:predict; openai: /v1/completions or "
        "/v1/chat/completions",
    )
    p.add_argument("--model", help="model name for --api openai (unset: first of GET /v1/models)")
    p.add_argument("--stream", action="store_true", help="print text as it arrives")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message")
    p.add_argument("--system", help="system message (implies --chat)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object {output, finish_reason, usage, ...} at the end",
    )
    p.add_argument(
        "--tokenizer",
        help="tokenizer.json (or a directory holding one) to count the tokens of a predict "
        "stream, which carries none",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds of silence allowed")
    p.add_argument("--retries", type=int, default=3, help="retries on 503, 429, no connection")
    p.add_argument(
        "--wait-ready",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for the server to be ready",
    )
    g = p.add_argument_group("sampling (None: not sent, so the server's default applies)")
    g.add_argument(
        "--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens to generate"
    )
    g.add_argument("--temperature", type=float, help="0 is greedy")
    g.add_argument("--top-k", type=int, help="1 is greedy")
    g.add_argument("--top-p", type=float, help="nucleus sampling mass")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--seed", type=int, help="sampling seed")
    g.add_argument("--repetition-penalty", type=float, help="1 is none")
    g.add_argument("--presence-penalty", type=float, help="0 is none")
    g.add_argument("--frequency-penalty", type=float, help="0 is none")
    g.add_argument("--streaming-interval", type=int, help="tokens per chunk (predict route)")
    return p


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(**{name: getattr(args, name) for name in SamplingParams.names()})


def count_tokens(tokenizer: str, text: str) -> int:
    """Tokens of ``text`` by a local tokenizer.json (the ``tokenizers`` package)."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ClientError("--tokenizer needs the 'tokenizers' package") from exc
    path = Path(tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the library raises its own exception types
        raise ClientError(f"cannot load tokenizer {path}: {exc}") from exc
    return len(tok.encode(text, add_special_tokens=False).ids)


def stream_report(
    api: str,
    text: str,
    finish_reason: str | None,
    usage: dict[str, Any] | None,
    broke: str | None,
    tokenizer: str | None,
) -> dict[str, Any]:
    """``finish_reason`` and ``usage`` of a stream, on every route.

    The OpenAI routes send both. The predict route's stream is text only: its
    ``finish_reason`` says how the body ended ("complete": the server finished it, for a
    stop token, a stop string or the length limit alike; "truncated": it broke off), and its
    ``usage`` counts completion tokens with ``--tokenizer`` (re-encoding the text, so
    close to, not always equal to, the server's count) or is null with a note.
    """
    report: dict[str, Any] = {"output": text}
    if broke is not None:
        report["finish_reason"] = "truncated"
        report["error"] = broke
    elif api == "predict":
        report["finish_reason"] = "complete"
    else:
        report["finish_reason"] = finish_reason
    if usage is not None:
        report["usage"] = usage
    elif api == "predict" and tokenizer:
        report["usage"] = {
            "prompt_tokens": None,
            "completion_tokens": count_tokens(tokenizer, text),
            "total_tokens": None,
            "counted_by": "client tokenizer",
        }
    else:
        report["usage"] = None
        report["usage_note"] = (
            PREDICT_STREAM_USAGE_NOTE
            if api == "predict"
            else "the server sent no usage (stream_options.include_usage was asked for)"
        )
    return report


def generate(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = sampling_from_args(args)
    messages: list[Message] | None = None
    if args.chat or args.system:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": prompt})
    with Client(
        args.url, timeout=args.timeout, retries=args.retries, api=args.api, model=args.model
    ) as client:
        try:
            if args.wait_ready > 0:
                client.wait_until_ready(args.wait_ready)
            if args.stream:
                return stream_to_stdout(client, args, prompt, messages, sampling)
            done = client.predict(
                None if messages else prompt, messages=messages, sampling=sampling
            )
            if args.json:
                print(json.dumps(done.to_dict(), ensure_ascii=False))
            else:
                print(done.output)
            if not done.output:
                return _empty_answer(done.finish_reason, args)
        except ClientError as exc:
            print(f"error: {exc}{unreachable_hint(exc)}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    return 0


def stream_to_stdout(
    client: Client,
    args: argparse.Namespace,
    prompt: str,
    messages: list[Message] | None,
    sampling: SamplingParams,
) -> int:
    start = time.perf_counter()
    ttft: float | None = None
    stream = client.stream(None if messages else prompt, messages=messages, sampling=sampling)
    broke: str | None = None
    try:
        for piece in stream:
            if ttft is None:
                ttft = time.perf_counter() - start
            if not args.json:
                sys.stdout.write(piece)
                sys.stdout.flush()
    except StreamError as exc:
        if not args.json:
            sys.stdout.write("\n")
            raise
        broke = str(exc)
    elapsed = time.perf_counter() - start
    if not args.json:
        sys.stdout.write("\n")
        return _empty_answer(stream.finish_reason, args) if not stream.text else 0
    usage = stream.usage
    report = stream_report(
        args.api,
        stream.text,
        stream.finish_reason,
        None if usage is None else usage.__dict__,
        broke,
        args.tokenizer,
    )
    report.update(ttft_s=ttft, e2e_s=elapsed, chunks=stream.state.chunks)
    print(json.dumps(report, ensure_ascii=False))
    if broke is not None:
        return 1
    return _empty_answer(report["finish_reason"], args) if not stream.text else 0


def _empty_answer(finish_reason: str | None, args: argparse.Namespace) -> int:
    """An empty answer is never a silent success: say so (with the likely fix) and exit 1."""
    note = EMPTY_ANSWER_NOTE.format(reason=finish_reason or "unknown")
    if args.chat or args.system:
        note = f"the server answered with no text (finish_reason: {finish_reason or 'unknown'})"
    print(f"error: {note}", file=sys.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from client.bench import main as bench_main

        return bench_main(argv[1:])
    return generate(argv)
