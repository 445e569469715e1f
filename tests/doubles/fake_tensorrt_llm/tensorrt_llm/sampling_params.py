"""Mirrors `SamplingParams` of tensorrt_llm/sampling_params.py (1.2.x): the same public
field names and defaults (max_tokens=32!), the same __post_init__ and _validate rules.
torch / C++ binding types are replaced by `Any`. A misspelled field raises TypeError here
exactly as it would in the real dataclass."""

import os
from dataclasses import dataclass, field
from typing import Any


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

    lookahead_config: Any = None
    guided_decoding: Any = None

    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

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
