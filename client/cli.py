"""`python -m client "What is a mistral?" --stream` and `python -m client bench ...`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from client.client import DEFAULT_URL, Client
from client.errors import ClientError
from client.types import Message, SamplingParams

USAGE_HINT = "python -m client PROMPT [options]  |  python -m client bench --help"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m client",
        description="Generate with the mistral-trt-truss server (or any OpenAI-compatible "
        "server with --api openai). Benchmark: python -m client bench --help",
    )
    p.add_argument("prompt", help="the prompt ('-' reads it from stdin)")
    p.add_argument("--url", default=DEFAULT_URL, help="server base URL (default %(default)s)")
    p.add_argument(
        "--api",
        choices=["predict", "openai"],
        default="predict",
        help="predict: POST /v1/models/model:predict; openai: /v1/completions or "
        "/v1/chat/completions",
    )
    p.add_argument("--model", help="model name for --api openai (default: first of GET /v1/models)")
    p.add_argument("--stream", action="store_true", help="print text as it arrives")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message")
    p.add_argument("--system", help="system message (implies --chat)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object {output, finish_reason, usage, ...} at the end",
    )
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--retries", type=int, default=3)
    p.add_argument(
        "--wait-ready",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to this long for the server to be ready",
    )
    g = p.add_argument_group("sampling (unset: the server's default)")
    g.add_argument("--max-new-tokens", type=int)
    g.add_argument("--temperature", type=float)
    g.add_argument("--top-k", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--seed", type=int)
    g.add_argument("--repetition-penalty", type=float)
    g.add_argument("--presence-penalty", type=float)
    g.add_argument("--frequency-penalty", type=float)
    g.add_argument("--streaming-interval", type=int, help="tokens per chunk (predict route)")
    return p


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(**{name: getattr(args, name) for name in SamplingParams.names()})


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
                start = time.perf_counter()
                ttft: float | None = None
                stream = client.stream(
                    None if messages else prompt, messages=messages, sampling=sampling
                )
                for piece in stream:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    if not args.json:
                        sys.stdout.write(piece)
                        sys.stdout.flush()
                elapsed = time.perf_counter() - start
                if args.json:
                    usage = stream.usage
                    print(
                        json.dumps(
                            {
                                "output": stream.text,
                                "finish_reason": stream.finish_reason,
                                "usage": None if usage is None else usage.__dict__,
                                "ttft_s": ttft,
                                "e2e_s": elapsed,
                                "chunks": stream.state.chunks,
                            },
                            ensure_ascii=False,
                        )
                    )
                else:
                    sys.stdout.write("\n")
            else:
                done = client.predict(
                    None if messages else prompt, messages=messages, sampling=sampling
                )
                if args.json:
                    print(json.dumps(done.to_dict(), ensure_ascii=False))
                else:
                    print(done.output)
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from client.bench import main as bench_main

        return bench_main(argv[1:])
    return generate(argv)
