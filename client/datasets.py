"""Benchmark prompts: from a file, or synthetic with a set length in server tokens."""

from __future__ import annotations

import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from client.types import Message

# Common English words; each is one or two tokens for Llama/Mistral-family tokenizers.
# Only the server's own count (usage.prompt_tokens) decides the final length.
_WORD_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have "
    "from or one had by word but not what all were we when your can said there use an each "
    "which she do how their if will up other about out many then them these so some her "
    "would make like him into time has look two more write go see number no way could people "
    "my than first water been call who oil its now find long down day did get come made may "
    "part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much "
    "before line right too mean old any same tell boy follow came want show also around form"
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class PromptItem:
    prompt: str | list[int] | None = None  # text, or token ids (OpenAI completions only)
    messages: list[Message] | None = None
    output_len: int | None = None

    def text_len(self) -> int:
        if self.prompt is not None:
            return len(self.prompt)
        return sum(len(m.get("content", "")) for m in self.messages or [])


def load_prompts(path: str | Path, chat: bool = False) -> list[PromptItem]:
    """One prompt per line, or JSONL objects with ``prompt`` or ``messages`` (and optionally
    ``output_len`` / ``max_new_tokens`` / ``max_tokens``). Blank lines are skipped.
    ``chat`` sends plain prompts as one user message."""
    items: list[PromptItem] = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    jsonl = str(path).endswith(".jsonl") or any(ln.lstrip().startswith("{") for ln in lines[:1])
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not jsonl:
            items.append(_item(line, None, None, chat))
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(obj, dict) or ("prompt" in obj) == ("messages" in obj):
            raise ValueError(f"{path}:{number}: need an object with 'prompt' or 'messages'")
        out = obj.get("output_len", obj.get("max_new_tokens", obj.get("max_tokens")))
        items.append(_item(obj.get("prompt"), obj.get("messages"), out, chat))
    if not items:
        raise ValueError(f"{path}: no prompts")
    return items


def _item(
    prompt: str | None, messages: list[Message] | None, out: int | None, chat: bool
) -> PromptItem:
    if prompt is not None and chat:
        return PromptItem(messages=[{"role": "user", "content": prompt}], output_len=out)
    return PromptItem(prompt=prompt, messages=messages, output_len=out)


def random_text(n_words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_words)))


@dataclass(frozen=True)
class LengthFit:
    """prompt_tokens ~= overhead + per_word * words, measured on the server."""

    overhead: float
    per_word: float

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead) / self.per_word))


async def fit_length(
    count_tokens: Callable[[str], Awaitable[int]], input_len: int, rng: random.Random
) -> LengthFit:
    """Two probes (``count_tokens`` returns the server's prompt_tokens for a text) give
    the template overhead and the tokens per word of the synthetic vocabulary."""
    w1 = max(4, input_len // 4)
    w2 = max(w1 + 8, input_len)
    t1 = await count_tokens(random_text(w1, rng))
    t2 = await count_tokens(random_text(w2, rng))
    per_word = (t2 - t1) / (w2 - w1)
    if per_word <= 0:
        raise RuntimeError(f"server token counts do not grow with the prompt ({t1}, {t2})")
    return LengthFit(overhead=t1 - per_word * w1, per_word=per_word)


def synthetic_prompts(
    n: int, fit: LengthFit, input_len: int, output_len: int, rng: random.Random, chat: bool = False
) -> list[PromptItem]:
    words = fit.words_for(input_len)
    return [_item(random_text(words, rng), None, output_len, chat) for _ in range(n)]


# Token ids drawn for id prompts: above the special and byte tokens of a 32k vocabulary.
TOKEN_ID_RANGE = (100, 31000)


def token_id_prompts(
    n: int, length: int, output_len: int | None = None, seed: int = 0, bos: int = 1
) -> list[PromptItem]:
    """n prompts of exactly ``length`` token ids (BOS, then random ids): an exact input
    length without fitting, for the OpenAI completions route."""
    if length < 1:
        raise ValueError("an id prompt needs at least one token")
    rng = random.Random(seed)
    lo, hi = TOKEN_ID_RANGE
    return [
        PromptItem(
            prompt=[bos] + [rng.randrange(lo, hi) for _ in range(length - 1)],
            output_len=output_len,
        )
        for _ in range(n)
    ]
