"""A non-streamed answer cut by the drain (its grace period ran out) is a 503 with the
route's error and the partial answer beside it, never a 200 with truncated text; streamed
answers keep their in-band / incomplete-body signal (tested in test_frontend.py)."""

from __future__ import annotations

import asyncio

import pytest

from mistral_serving.text.tokenizer import Tokenizer
from tests.doubles.scripted_engine import ScriptedEngine
from tests.unit.test_frontend import LIMITS, TEXT, Client, body, call, serve


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        ("predict", {"prompt": "Hi"}),
        ("chat_completions", {"messages": [{"role": "user", "content": "Hi"}]}),
        ("completions", {"prompt": "Hi"}),
    ],
)
def test_a_non_streamed_answer_cut_by_the_drain_is_a_503_with_the_partial_text(
    tok: Tokenizer,  # noqa: F811
    route: str,
    fields: dict,
) -> None:
    engine = ScriptedEngine.from_ids(tok.encode(TEXT), finish_reason=None, limits=LIMITS)
    served = serve(tok, engine)
    client = Client(body(**fields), route=route)

    async def main() -> None:
        task = asyncio.ensure_future(call(served, client))
        while engine.num_running() == 0 or not engine.calls:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # the scripted text is out; the request waits
        served.frontend.drainer.draining = True
        assert served.frontend._abort_all() == 1  # the grace period is over
        await asyncio.wait_for(task, 60)

    asyncio.run(main())
    assert client.status == 503
    answer = client.json()
    assert "cut short" in str(answer["error"])
    if route == "predict":
        assert answer["output"] == TEXT and answer["finish_reason"] == "abort"
    else:
        (choice,) = answer["choices"]
        text = choice["message"]["content"] if route == "chat_completions" else choice["text"]
        assert text == TEXT and choice["finish_reason"] == "abort"
        assert answer["error"]["type"]  # OpenAI's error shape, so SDKs raise (and retry)
    assert served.counts(route) == {"abort": 1}
    assert served.frontend.admission.inflight == 0
