"""Mirrors tensorrt_llm/sampling_params.py (1.2.x): `SamplingParams` with the same public field
names and defaults (max_tokens=32!), `__post_init__`, `_validate` and `_greedy_decoding`, and
`GuidedDecodingParams` with its `_validate`. torch / C++ binding types are replaced by `Any`.
A misspelled field raises TypeError here exactly as it would in the real dataclass.

`prompt_ignore_length` (presence/frequency penalties skip that many prompt tokens; default
None = the C++ default 0, so prompt tokens ARE penalised) was added upstream by
NVIDIA/TensorRT-LLM PR #8127 (Oct 2025) and is in 1.2.0 GA (PR #13633 plumbs the same
`promptIgnoreLength` through the Triton backend and names 1.2.0 as having it)."""

import os
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    """sampling_params.py::GuidedDecodingParams: only one guide may be set."""

    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self):
        num_guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if num_guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {num_guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    _bad_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    _stop_word_ids: list[list[int]] | None = field(default=None, init=False, repr=False)

    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False

    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False

    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    prompt_ignore_length: int | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None

    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list[str] | None = None

    # Set by the LLM API (`llm.py::_prepare_sampling_params`), not by users.
    _context_logits_auto_enabled: bool = False
    _generation_logits_auto_enabled: bool = False
    _return_log_probs: bool = False

    lookahead_config: Any = None
    guided_decoding: GuidedDecodingParams | None = None

    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    _stream_interval: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        self._validate()

    def _validate(self):
        if self.top_p is not None and (self.top_p < 0 or self.top_p > 1):
            raise ValueError(f"require 0 <= top_p <= 1, got top_p={self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"require top_k >= 0, got top_k={self.top_k}")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"require temperature >= 0, got temperature={self.temperature}")
        if self.best_of is not None and self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if (
            self.best_of is not None
            and self.best_of > 1
            and self._greedy_decoding
            and not os.environ.get("TLLM_ALLOW_N_GREEDY_DECODING", None)
        ):
            raise ValueError("Greedy decoding in the LLM API does not allow multiple returns.")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < 1:
            raise ValueError(
                f"truncate_prompt_tokens must be >= 1, got {self.truncate_prompt_tokens}"
            )
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        # The real one: `logprobs=True` means top-1; 0 / None mean off.
        self.logprobs = self.logprobs and int(self.logprobs)
        self.prompt_logprobs = self.prompt_logprobs and int(self.prompt_logprobs)

    @staticmethod
    def params_imply_greedy_decoding(
        *, temperature: float | None, top_p: float | None, top_k: int | None
    ):
        return (
            (temperature is None and top_p is None and top_k is None)
            or top_k == 1
            or top_p == 0.0
            or temperature == 0
        )

    @property
    def _greedy_decoding(self) -> bool:
        return not self.use_beam_search and self.params_imply_greedy_decoding(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
        )
