"""From engine tokens to the text chunks a client receives.

`TextStream` chains the incremental detokenizer, stop strings and throttling:
- stop strings end the output before the stop string (never included, never half-sent:
  text that could still become a stop string is held back until it cannot);
- `interval` tokens make one chunk (the original Baseten article's `streaming_interval`);
- the chunks joined equal `text` (the non-streaming output) exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from mistral_serving.text.detokenizer import IncrementalDetokenizer
from mistral_serving.text.tokenizer import TokenTable


class StopMatcher:
    """Finds the earliest stop string in a growing text, holding back possible prefixes."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, text: str) -> str:
        """Text that is now safe to send; sets `stopped` when a stop string appeared."""
        if not self._stops or self.stopped:
            return "" if self.stopped else text
        buf = self._pending + text
        hits = [(i, s) for s in self._stops if (i := buf.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])  # the first listed on a tie
            self.stopped = True
            self._pending = ""
            return buf[:at]
        keep = self._held_suffix(buf)
        self._pending = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return "" if self.stopped else text

    def _held_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        for n in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-n:]
            if any(s.startswith(tail) for s in self._stops):
                return n
        return 0


class TextStream:
    def __init__(self, table: TokenTable, stops: Sequence[str] = (), interval: int = 1) -> None:
        if interval < 1:
            raise ValueError("interval must be at least 1")
        self._detok = IncrementalDetokenizer(table)
        self._stop = StopMatcher(stops)
        self._interval = interval
        self._unsent: list[str] = []
        self._tokens_since_chunk = 0
        self._parts: list[str] = []
        self.num_tokens = 0

    @property
    def stopped(self) -> bool:
        """A stop string appeared: the caller should end generation."""
        return self._stop.stopped

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the output (Anthropic's `stop_sequence`), if one did."""
        return self._stop.matched

    @property
    def text(self) -> str:
        """Everything released so far (after `finish`: the whole output)."""
        return "".join(self._parts)

    def add(self, token_ids: Sequence[int]) -> str | None:
        """Feed new tokens; returns a chunk when `interval` tokens have gathered and
        there is text to send, else None."""
        if self.stopped:
            return None
        self.num_tokens += len(token_ids)
        self._release(self._stop.push(self._detok.push(list(token_ids))))
        self._tokens_since_chunk += len(token_ids)
        if self._tokens_since_chunk >= self._interval or self.stopped:
            self._tokens_since_chunk = 0
            return self._take()
        return None

    def finish(self) -> str:
        """The last chunk (may be empty) once generation has ended."""
        if not self.stopped:
            self._release(self._stop.push(self._detok.flush()))
            self._release(self._stop.flush())
        return self._take() or ""

    def _release(self, text: str) -> None:
        if text:
            self._unsent.append(text)
            self._parts.append(text)

    def _take(self) -> str | None:
        if not self._unsent:
            return None
        chunk = "".join(self._unsent)
        self._unsent.clear()
        return chunk
