"""`transformers serve` (the peer in docs/performance.md), started as its own CLI does,
with one addition: its /v1/completions stream ends without OpenAI's `data: [DONE]`
terminator (transformers 5.17), which `python -m client bench` requires, so each stream
gets that one line appended. Nothing else about the server changes.

    python bench/peer_serve.py MODEL_DIR --continuous-batching --port 8000 ...
"""

from __future__ import annotations

import sys


def add_done_line() -> None:
    from transformers.cli.serving import completion

    streaming = completion.CompletionHandler._streaming

    def _streaming(self, *args, **kwargs):
        response = streaming(self, *args, **kwargs)
        body = response.body_iterator

        async def with_done():
            async for chunk in body:
                yield chunk
            yield "data: [DONE]\n\n"

        response.body_iterator = with_done()
        return response

    completion.CompletionHandler._streaming = _streaming


def main() -> None:
    from transformers.cli.transformers import main as cli

    add_done_line()
    sys.argv = ["transformers", "serve", *sys.argv[1:]]
    cli()


if __name__ == "__main__":
    main()
