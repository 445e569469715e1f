"""The artifact's tokenizer: exact encoding, and a per-token byte table for decoding.

Encoding uses SentencePiece when the artifact ships `tokenizer.model` (Mistral and
Llama-2 repos do): that is what Mistral's reference encoder (`mistral-common`) runs, so
prompts and chats get exactly its token ids; the converted `tokenizer.json` of these
models merges whitespace differently on some inputs. Without `tokenizer.model` the
Hugging Face tokenizer encodes.

The artifact's files also decide how a chat is encoded (`chat_format`, used by
`chat.encode_chat`) and which tokens end a generation (`stop_token_ids`: the tokenizer's
EOS plus every `eos_token_id` of generation_config.json, which may be a list).

Decoding never calls a whole-text decode: every token id maps to the bytes it stands for
(`TokenTable`), and `detokenizer.IncrementalDetokenizer` turns a stream of ids into text
in time linear in the output.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from mistral_serving.artifacts.file_bounds import check_parsed_files

SPIECE_UNDERLINE = "▁"

# How chat messages become prompt ids (see chat.encode_chat):
#   "mistral":  the artifact ships tokenizer.model: mistral-common's instruct encoding,
#               token for token (Mistral's own chat template loses tokens, see chat.py);
#   "template": the checkpoint's own chat template (tokenizer_config.json or
#               chat_template.jinja), rendered and tokenized by transformers;
#   "none":     no chat format known: chat requests are refused with a clear message.
ChatFormat = Literal["mistral", "template", "none"]
# (messages, tools or None) -> prompt ids; messages are OpenAI-shaped dicts.
ChatTemplateFn = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], list[int]]

# How a model is asked for tool calls and how its answer is read (tools/parsers/registry.py):
#   "mistral":       a Mistral tokenizer with tool tokens (v3 and later: [AVAILABLE_TOOLS],
#                    [TOOL_CALLS], [TOOL_RESULTS]), encoded as mistral-common does;
#   "hermes":        a chat template that takes `tools` and writes `<tool_call>` blocks;
#   "llama3_json":   a Llama-3.1-style template that takes `tools` (JSON calls, `ipython`);
#   "fallback_json": anything else (Mistral v1, templates without tools): the tools are
#                    described in the system turn and the model answers `TOOL_CALLS: [..]`.
ToolFormat = Literal["mistral", "hermes", "llama3_json", "fallback_json"]
# Mistral's control pieces the v3 encoding writes (mistral-common's SpecialTokens).
MISTRAL_TOOL_PIECES = (
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
)
# Tool-call markup a model writes: kept as text when decoding (a special token is
# otherwise skipped), so the answer's parser sees where a call starts.
VISIBLE_MARKUP = frozenset({"[TOOL_CALLS]", "<tool_call>", "</tool_call>", "<|python_tag|>"})


@dataclass(frozen=True)
class TokenTable:
    """What each token id decodes to.

    kind "sentencepiece": pieces with "▁" for spaces and byte-fallback tokens <0xNN>;
      a run of byte tokens decodes as a whole (invalid UTF-8 -> one U+FFFD per byte, as
      the Hugging Face ByteFallback decoder does) and one leading space is stripped.
    kind "byte_level": GPT-2 style byte-level BPE (Llama 3); bytes concatenate and
      decode with replacement of invalid sequences.
    """

    kind: Literal["sentencepiece", "byte_level"]
    token_bytes: tuple[bytes | None, ...]  # None: special token, skipped when decoding
    is_byte_token: tuple[bool, ...]
    strip_leading_space: bool


class Tokenizer:
    def __init__(
        self,
        table: TokenTable,
        bos_id: int | None,
        eos_id: int,
        encode_fn: Callable[[str], list[int]],  # no special tokens added
        *,
        add_bos: bool = True,
        stop_token_ids: Sequence[int] = (),
        chat_format: ChatFormat = "mistral",
        chat_template_fn: ChatTemplateFn | None = None,
        special_ids: dict[str, int] | None = None,
        tool_format: ToolFormat = "fallback_json",
    ) -> None:
        self.table = table
        self.bos_id = bos_id
        self.eos_id = eos_id
        self._encode = encode_fn
        # Whether the model's own tokenizer puts BOS before a text (SentencePiece Llama
        # and Mistral do; ChatML models such as SmolLM2 have none, and their "BOS" id is
        # <|im_start|>, which must not start a plain prompt).
        self.add_bos = add_bos and bos_id is not None
        # Every id that ends a generation, EOS first; the service passes them to the
        # engine in SamplingOptions.stop_token_ids.
        self.stop_token_ids: tuple[int, ...] = tuple(dict.fromkeys((eos_id, *stop_token_ids)))
        if chat_format == "template" and chat_template_fn is None:
            raise ValueError("chat_format 'template' needs chat_template_fn")
        self.chat_format: ChatFormat = chat_format
        self._chat_template_fn = chat_template_fn
        # Control pieces by name (SentencePiece tokenizers): the v3 chat encoding's tokens.
        self.special_ids: dict[str, int] = dict(special_ids or {})
        self.tool_format: ToolFormat = tool_format

    @property
    def vocab_size(self) -> int:
        return len(self.table.token_bytes)

    def encode(self, text: str, bos: bool = False) -> list[int]:
        """Token ids of `text`; with `bos`, preceded by BOS where this model's tokenizer
        adds one to a text (see `add_bos`)."""
        ids = self._encode(text)
        if bos and self.add_bos and self.bos_id is not None:  # add_bos implies a BOS id
            return [self.bos_id, *ids]
        return ids

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Prompt ids from the checkpoint's chat template with the assistant's turn opened
        (chat_format "template" only); `tools` only where the template takes them (tool
        format hermes or llama3_json). Template errors propagate: chat.py words them."""
        if self._chat_template_fn is None:
            raise ValueError(f"this tokenizer's chat format is {self.chat_format!r}")
        return self._chat_template_fn(messages, tools)


def load_tokenizer(artifact_dir: Path, prefer_sentencepiece: bool = True) -> Tokenizer:
    # Every tokenizer file within its bound before SentencePiece, tokenizers or
    # transformers parse one (an ArtifactError naming the file and the bound).
    check_parsed_files(artifact_dir)
    sp_model = artifact_dir / "tokenizer.model"
    stop_ids = generation_eos_ids(artifact_dir)
    if prefer_sentencepiece and sp_model.is_file():
        return _sentencepiece_tokenizer(sp_model, stop_ids)
    if (artifact_dir / "tokenizer.json").is_file():
        return _hf_tokenizer(artifact_dir, stop_ids)
    raise FileNotFoundError(
        f"{artifact_dir}: no tokenizer.model or tokenizer.json; the artifact must ship its "
        "tokenizer files (build.py copies them next to the engine)"
    )


def generation_eos_ids(artifact_dir: Path) -> tuple[int, ...]:
    """generation_config.json's eos_token_id (an int or a list), as transformers'
    `generate` stops on it; () if the file or the key is absent."""
    path = artifact_dir / "generation_config.json"
    if not path.is_file():
        return ()
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"{path}: not a JSON object ({exc})") from None
    values = value if isinstance(value, list) else [value]
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
        raise ValueError(f"{path}: eos_token_id must be an integer or a list of integers")
    return tuple(v for v in values if v is not None)


def _sentencepiece_tokenizer(path: Path, stop_ids: tuple[int, ...] = ()) -> Tokenizer:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    token_bytes: list[bytes | None] = []
    is_byte: list[bool] = []
    controls: dict[str, int] = {}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_control(i) and piece in VISIBLE_MARKUP:
            controls[piece] = i
            token_bytes.append(piece.encode())
            is_byte.append(False)
        elif sp.is_control(i) or sp.is_unknown(i):
            if sp.is_control(i):
                controls[piece] = i
            token_bytes.append(None)
            is_byte.append(False)
        elif sp.is_byte(i):
            token_bytes.append(bytes([int(piece[3:5], 16)]))
            is_byte.append(True)
        else:
            token_bytes.append(piece.replace(SPIECE_UNDERLINE, " ").encode())
            is_byte.append(False)
    table = TokenTable("sentencepiece", tuple(token_bytes), tuple(is_byte), True)
    # tokenizer.model ships with Mistral and Llama-2 repos: mistral-common's chat encoding
    # (v1, or v3 with tool tokens when every control piece of that encoding is there).
    v3 = all(p in controls for p in MISTRAL_TOOL_PIECES)
    return Tokenizer(
        table,
        sp.bos_id(),
        sp.eos_id(),
        lambda text: sp.encode(text),
        stop_token_ids=stop_ids,
        chat_format="mistral",
        special_ids=controls if v3 else {},
        tool_format="mistral" if v3 else "fallback_json",
    )


def _byte_level_decoder_map() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in char -> byte value."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _hf_tokenizer(artifact_dir: Path, stop_ids: tuple[int, ...] = ()) -> Tokenizer:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(artifact_dir))
    spec = json.loads((artifact_dir / "tokenizer.json").read_text())
    byte_level = "ByteLevel" in json.dumps(spec.get("decoder"))
    table = _hf_token_table(tok, byte_level)
    eos = tok.eos_token_id
    if eos is None:
        raise ValueError(f"{artifact_dir}: tokenizer has no eos token")
    bos = tok.bos_token_id
    # Does the model's tokenizer put BOS before a text? (Its post-processor decides.)
    add_bos = bos is not None and tok.encode("a", add_special_tokens=True)[:1] == [bos]
    if (artifact_dir / "tokenizer.model").is_file():
        chat_format: ChatFormat = "mistral"  # a Mistral repo read through tokenizer.json
    elif getattr(tok, "chat_template", None):
        chat_format = "template"
    else:
        chat_format = "none"
    tool_format = template_tool_format(getattr(tok, "chat_template", None))
    if chat_format != "template":
        tool_format = "fallback_json"
    return Tokenizer(
        table,
        bos,
        eos,
        lambda text: tok.encode(text, add_special_tokens=False),
        add_bos=add_bos,
        stop_token_ids=stop_ids,
        chat_format=chat_format,
        chat_template_fn=(lambda messages, tools: _render_chat(tok, messages, tools))
        if chat_format == "template"
        else None,
        tool_format=tool_format,
    )


def _hf_token_table(tok: Any, byte_level: bool) -> TokenTable:
    """Each token's bytes from a Hugging Face tokenizer's pieces (None for a special
    token), as a byte-level or a SentencePiece vocabulary spells them."""
    # Added tokens marked special (SmolLM2's <repo_name>, <file_sep>, ...) are skipped by
    # the Hugging Face decoder like the named special tokens are.
    special = set(tok.all_special_ids) | {
        i for i, t in tok.added_tokens_decoder.items() if getattr(t, "special", False)
    }
    pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
    byte_map = _byte_level_decoder_map() if byte_level else {}
    token_bytes: list[bytes | None] = []
    is_byte: list[bool] = []
    for i, piece in enumerate(pieces):
        if piece in VISIBLE_MARKUP:
            token_bytes.append(piece.encode())
            is_byte.append(False)
        elif i in special or piece is None:
            token_bytes.append(None)
            is_byte.append(False)
        elif byte_level:
            token_bytes.append(
                bytes(byte_map[c] for c in piece)
                if all(c in byte_map for c in piece)
                else piece.encode()
            )
            is_byte.append(False)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            token_bytes.append(bytes([int(piece[3:5], 16)]))
            is_byte.append(True)
        else:
            token_bytes.append(piece.replace(SPIECE_UNDERLINE, " ").encode())
            is_byte.append(False)
    kind: Literal["sentencepiece", "byte_level"] = "byte_level" if byte_level else "sentencepiece"
    return TokenTable(kind, tuple(token_bytes), tuple(is_byte), not byte_level)


def template_tool_format(template: object) -> ToolFormat:
    """Which tool format a chat template speaks: it must take `tools` and write a markup
    this server has a parser for; anything else gets the described fallback."""
    if not isinstance(template, str) or not re.search(r"\btools\b", template):
        return "fallback_json"
    if "<tool_call>" in template:
        return "hermes"
    if "ipython" in template or "<|python_tag|>" in template:
        return "llama3_json"
    return "fallback_json"


class ChatTemplateRefused(ValueError):
    """The chat template did not place the messages' contents as given (chat.py: a 400)."""


def _render_chat(
    tok: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The template's control tokens, and each message's content encoded as text: content
    that spells a special token ("<|im_start|>system ...") must not become that token and
    forge a turn. Content without such text (nearly all) takes transformers' own path,
    token for token. `tools` go to the template as transformers' `tools=` argument."""
    special = {t.content for t in tok.added_tokens_decoder.values() if t.special}
    special.update(tok.all_special_tokens)
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    # Tool definitions and past calls are rendered by the template as JSON, with no place
    # to encode them as plain text: one that spells a special token is refused.
    structured = json.dumps([tools, [m.get("tool_calls") for m in messages]], ensure_ascii=False)
    if any(s and s in structured for s in special):
        raise ChatTemplateRefused(
            "a tool definition or tool call holds a special token's text; remove it"
        )
    texts = [m.get("content") for m in messages]
    if not any(isinstance(c, str) and s in c for c in texts for s in special if s):
        # tokenize=True tokenizes the rendered text without adding special tokens (the
        # template writes its own); return_dict=False: a plain list in transformers 4 and 5.
        # cast: transformers types the result as the union over every mode; this mode
        # (tokenize=True, return_dict=False, one conversation) returns a list of ids.
        plain = cast(
            "list[int]",
            tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
            ),
        )
        return [int(i) for i in plain]
    # Render with a fresh placeholder per content, then encode the template's text with
    # its special tokens and each content with special tokens split into plain text.
    nonce = secrets.token_hex(8)
    placed_at = [i for i, c in enumerate(texts) if isinstance(c, str) and c]
    placed = [
        m | {"content": f"\x00{nonce}:{i}\x00"} if i in placed_at else m
        for i, m in enumerate(messages)
    ]
    text = tok.apply_chat_template(placed, add_generation_prompt=True, tokenize=False, **extra)
    if not isinstance(text, str):  # tokenize=False renders one conversation to text
        raise TypeError(f"apply_chat_template(tokenize=False) gave {type(text).__name__}")
    found = re.findall(f"\x00{nonce}:(\\d+)\x00", text)
    if sorted(found) != sorted(str(i) for i in placed_at):
        raise ChatTemplateRefused(
            "this model's chat template transforms message content, and a message holds a "
            "special token's text; remove it from the message"
        )
    ids: list[int] = []
    for i, part in enumerate(re.split(f"\x00{nonce}:(\\d+)\x00", text)):
        if i % 2:  # a placeholder: that message's content, as text
            content = messages[int(part)]["content"]
            enc = tok(content, add_special_tokens=False, split_special_tokens=True)
            ids += enc["input_ids"]
        elif part:
            ids += tok.encode(part, add_special_tokens=False)
    return [int(i) for i in ids]
