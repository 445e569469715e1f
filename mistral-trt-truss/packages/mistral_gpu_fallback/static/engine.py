"""The PyTorch engine's fast path: a preallocated (static) KV cache and CUDA graphs.

Selected by `pytorch_kv_cache: static`, and by `auto` on a CUDA GPU (Llama/Mistral-family
checkpoints only; engines/factory.py). Same
async interface, admission, abort and per-request sampling as `TorchEngine`; what
changes is the batch underneath:

- The KV cache is allocated once: `[layers, slots, kv_heads, max_seq_len, head_dim]` for
  keys and for values, one slot per running sequence (`max_batch_size` slots). A
  sequence's token at position p is written to its slot at column p (an index write),
  so nothing is concatenated, padded or copied per step the way a growing
  `DynamicCache` is.
- Running sequences occupy slots 0..n-1 (a finished sequence's hole is filled by moving
  the last one into it: one copy of that sequence's own columns), so a decode step works
  on a contiguous view of the cache.
- The forward pass is our own, over the checkpoint's own modules and weights (embedding,
  RMSNorm, q/k/v/o, RoPE, MLP, lm_head), so it has static shapes: one decode step for a
  batch bucket (1, 2, 4, ... slots) and a length bucket (the longest sequence rounded up
  to a multiple of 256 columns) is captured once as a CUDA graph and replayed, which takes
  the ~1,500 kernel launches of a 32-layer step off the Python critical path. The step's
  attention is the ops' `decode_attention` (`fused.py`): with the Triton kernels each row
  reads its own columns up to its position; the torch ops mask the length bucket.
- Prefill is the same forward pass over the new prompts (right-padded; causal attention
  keeps padding from reaching real positions), writing their keys and values straight
  into their slots. A request asking for prompt logprobs (echo) gets lm_head applied to
  its own prompt positions of that same pass, in chunks (`prefill.py`: the admission and
  logits rule both PyTorch engines share).

Chunked prefill (`prefill_chunk_tokens` > 0): an admitted prompt takes a free slot at once
and is prefilled over as many steps as it needs, at most `prefill_chunk_tokens` prompt
tokens per step (shared, oldest first, by the prompts under way), added to the decode step
of the running rows. A step that carries prompt tokens is one eager forward pass over a
flat token axis, [the running rows' next tokens, then each piece's prompt tokens], as
TensorRT-LLM's and vLLM's chunked prefill mix them: the linear layers, norms, RoPE and
lm_head (only for the tokens that are sampled from) run once over all of them, so the
weights are read once per step; only attention is split (each decode row's query over its
slot's columns, as in the decode graph; each piece's queries over its own slot's earlier
columns and causally within the piece). A step with no prompt tokens is the captured
decode graph, as without chunks. A prompt whose last piece is done joins the running rows
(its columns moved down to the next row when its slot is not that row) and gets its first
token. So a burst of prompts costs the decoding rows one chunk's tokens per step instead of
one whole prefill.

Overlapped decode (`overlap_decode`, on by default): while every running row is plain
greedy, a decode step's tokens are picked on the device (`sampling.greedy_tokens`), written
where the next step reads its input, and copied to the host behind the step; the next step
is launched before the host reads them, so the host's bookkeeping and delivery of step k run
while the GPU runs step k+1 (vLLM's async scheduling, one step deep). A row that ended at
step k (a stop token: only the host knows) rides step k+1 too, and that token is dropped; it
stays inside its slot (its last position is at most `max_seq_len` - 1). Anything else the
pass must do (admitting requests, chunked prefill, a row with penalties, logprobs, masks,
sampling or a pending `min_tokens`) first reads the step under way, and runs as before.

The cache must fit: its column count is `max_seq_len` when set, else what
`kv_cache_free_gpu_memory_fraction` of the free GPU memory holds for `max_batch_size`
slots (capped at the model's positions); the engine's limits report that length.

KV-cache usage (the gauge) is the positions the running sequences hold over
`slots x columns`.
"""

from __future__ import annotations

import logging
import math
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F

from mistral_gpu_fallback.static import fused, guided_profile, llama
from mistral_gpu_fallback.static.guided_batch import BatchMasker
from mistral_gpu_fallback.static.weights import copy_shards, read_header
from mistral_serving.engines.base import EngineError, EngineLimits, TokenDelta, TokenLogprob
from mistral_serving.engines.pytorch.dynamic import (
    LoadedModel,
    TorchEngine,
    TorchOptions,
    _Sequence,
    load_model,
)
from mistral_serving.engines.pytorch.prefill import chunked_prompt_logprobs, is_allocation_failure
from mistral_serving.engines.sampling import greedy_tokens, pick_of, plain_greedy
from mistral_serving.settings import GpuFallbackSettings, TorchEngineSettings

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

log = logging.getLogger(__name__)

LENGTH_BUCKET = 256  # decode attends to the first ceil(len / 256) * 256 columns


def supports_static_path(model: torch.nn.Module) -> str | None:
    """None if `model` is a decoder this fast path can run, else why not."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or layers is None or not hasattr(model, "lm_head"):
        return "not a Llama/Mistral-style decoder (model.model.layers, lm_head)"
    attn = getattr(layers[0], "self_attn", None)
    if attn is None or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention is not q/k/v/o projections"
    if any(getattr(attn, n).bias is not None for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention projections have biases"
    mlp = getattr(layers[0], "mlp", None)
    if mlp is None or not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        return "MLP is not gate/up/down"
    cfg = model.config
    if getattr(cfg, "sliding_window", None):
        return "sliding-window attention"
    rope = getattr(inner.rotary_emb, "rope_type", "default")
    if rope not in ("default", "linear", "llama3"):
        return f"rope type {rope}"
    return None


STATIC_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")


def static_path_problem(config: dict[str, Any]) -> str | None:
    """From config.json alone (before any weight is read): None if this checkpoint is
    one the fast path runs (Llama/Mistral, and what `llama.unsupported` accepts: SiLU, no
    sliding window, no biases, a rope type it implements), else why not.
    `supports_static_path` checks the loaded modules too."""
    archs = config.get("architectures") or []
    if not any(a in STATIC_ARCHITECTURES for a in archs):
        return f"architecture {'/'.join(archs) or 'unknown'} is not Llama/Mistral"
    return llama.unsupported(types.SimpleNamespace(**config))


class _NotDirect(Exception):
    """The direct loader cannot load this checkpoint; transformers' loader will."""


def load_safetensors_direct(
    model_dir: Path, config: Any, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module | None:
    """The decoder's modules (`engines/pytorch/llama.py`, not transformers' modeling code) made
    without memory (meta device), given uninitialised tensors on `device`, and every
    safetensors tensor copied straight into its parameter (`weights.copy_shards`: large
    sequential reads through pinned buffers). Skips transformers' loader (weight init,
    key conversion, per-tensor dispatch) and its modeling imports, which took most of a
    7B start. None, logging why, for anything it does not recognise: `load_model` then
    loads it with transformers' `from_pretrained`."""
    try:
        return _load_direct(model_dir, config, dtype, device)
    except _NotDirect as exc:
        log.info("loading with transformers' from_pretrained: %s", exc)
        return None  # load_model's own from_pretrained path


def _load_direct(
    model_dir: Path, config: Any, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module:
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise _NotDirect("no safetensors files")
    if why := llama.unsupported(config):
        raise _NotDirect(why)
    began = time.perf_counter()
    model = llama.CausalLM(config, "meta", dtype)
    targets = model.state_dict()  # names -> tensors sharing the parameters' storage
    try:
        headers = {shard: read_header(shard) for shard in shards}
    except (OSError, ValueError) as exc:
        raise _NotDirect(str(exc)) from None
    shapes = {e.name: e.shape for entries in headers.values() for e in entries}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing = set(targets) - set(shapes) - ({"lm_head.weight"} if tied else set())
    unexpected = set(shapes) - set(targets)
    if missing or unexpected:
        raise _NotDirect(
            f"checkpoint names differ from the model's (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )
    for name, shape in shapes.items():
        if tuple(targets[name].shape) != shape:
            raise _NotDirect(f"{name}: shape {shape} differs from the model's")
    llama.allocate(model, device)
    targets = model.state_dict()
    started = time.perf_counter()
    copy_shards(headers, {name: targets[name] for name in shapes})
    if tied:
        model.tie_weights()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    size = sum(s.stat().st_size for s in shards) / 1e9
    log.info(
        "weights: model made and allocated on %s in %.1f s, %.2f GB copied in %.1f s (%.2f GB/s)",
        device,
        started - began,
        size,
        seconds,
        size / seconds,
    )
    return model


def light_config(raw: dict[str, Any]) -> Any | None:
    """The checkpoint's config.json (`raw`, as read once by the artifact) as transformers'
    base config class, or None where the model's own class is needed: a key missing whose
    default is the model class's (`llama.config_keys_without_shared_defaults`) or a RoPE
    other than the default (the model class normalises its parameters). The model's own
    class costs a cold start seconds: in transformers 5.17 its docstring decorator imports
    the auto model classes and, through them, generation and tensor-parallel code
    (torch.distributed.tensor's custom-op registration, scikit-learn;
    docs/perf/history/round-06.md, goal 4)."""
    from transformers import PretrainedConfig

    if any(k not in raw for k in llama.config_keys_without_shared_defaults(raw)):
        return None
    rope = types.SimpleNamespace(
        rope_parameters=raw.get("rope_parameters"), rope_scaling=raw.get("rope_scaling")
    )
    theta = llama.rope_parameters(rope).get("rope_theta") or raw.get("rope_theta")
    if llama.rope_type(rope) != "default" or not theta:
        return None
    try:
        return PretrainedConfig.from_dict(dict(raw))
    except Exception:  # noqa: BLE001 - its validators' errors: AutoConfig's path reports them
        return None


def load_static_model(
    model_dir: Path, settings: TorchEngineSettings, raw_config: dict[str, Any] | None = None
) -> LoadedModel:
    """The checkpoint for the fast path: `load_model` with the direct safetensors loader
    (and, given config.json's contents, the light config object)."""
    config = light_config(raw_config) if raw_config is not None else None
    return load_model(model_dir, settings, loader=load_safetensors_direct, config=config)


_FALLBACK = GpuFallbackSettings.model_fields


@dataclass(frozen=True)
class StaticOptions(TorchOptions):
    """The PyTorch engine's options, and the static KV cache's own (defaults: Settings')."""

    cuda_graphs: bool = _FALLBACK["cuda_graphs"].default
    prefill_chunk_tokens: int = _FALLBACK["prefill_chunk_tokens"].default  # 0: off
    fused_kernels: str = _FALLBACK["fused_kernels"].default  # auto | on | off
    overlap_decode: bool = _FALLBACK["overlap_decode"].default

    @classmethod
    def from_settings(cls, settings: TorchEngineSettings) -> StaticOptions:
        base = TorchOptions.from_settings(settings)
        if not isinstance(settings, GpuFallbackSettings):  # the engine's own defaults
            return cls(base.max_num_tokens, base.prefill_logits_bytes)
        return cls(
            base.max_num_tokens,
            base.prefill_logits_bytes,
            settings.cuda_graphs,
            settings.prefill_chunk_tokens,
            settings.fused_kernels,
            settings.overlap_decode,
        )

    @classmethod
    def of(cls, options: TorchOptions) -> StaticOptions:
        if isinstance(options, StaticOptions):
            return options
        return cls(options.max_num_tokens, options.prefill_logits_bytes)


class StaticTorchEngine(TorchEngine):
    @classmethod
    def options_for(cls, settings: TorchEngineSettings) -> TorchOptions:
        return StaticOptions.from_settings(settings)

    def _prepare(self, model: torch.nn.Module, limits: EngineLimits, base: TorchOptions) -> None:
        options = StaticOptions.of(base)
        why = supports_static_path(model)
        if why is not None:
            raise EngineError(f"pytorch_kv_cache=static cannot run this model: {why}")
        probed: Any = cast(Any, model)  # a decoder's modules, read by name
        cfg = probed.config
        self._layers: list[Any] = list(probed.model.layers)
        self._n_heads = cfg.num_attention_heads
        self._n_kv = llama.kv_heads_of(cfg)
        self._head_dim = llama.head_dim_of(cfg)
        self._slots = limits.max_batch_size
        self._cols = limits.max_seq_len
        p = next(model.parameters())
        self._use_graphs = options.cuda_graphs and p.device.type == "cuda"
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: _POOL_HANDLE | None = None
        self._lens: list[int] = []  # per running row: tokens in its slot (CPU mirror)
        self._k: torch.Tensor | None = None  # the KV cache: made on the engine thread
        self._v: torch.Tensor | None = None
        self._wqkv: list[torch.Tensor] = []
        self._wgu: list[torch.Tensor] = []
        self._chunk = options.prefill_chunk_tokens  # 0: whole prompts (TorchEngine's loop)
        self._prefilling: list[_Prefilling] = []  # chunked prefills under way, oldest first
        self._mixed_committed = False  # the current mixed step has committed (see _chunk_step)
        # Structured output: one bitmask per step for all constrained rows
        # (`guided_batch.py`). Each row masks itself (`guided.GuidedMatcher.mask`) when the
        # batched fill fails, or when this is False (the tests' reference path).
        self.batch_masks = True
        self._masker: BatchMasker | None = None
        self._profile = guided_profile.from_env()  # benchmarks' timers; None: none taken
        self._overlap = options.overlap_decode
        self._launched: _Launched | None = None  # the decode step whose tokens are unread
        self._host_tok: list[torch.Tensor] = []  # pinned: where launched steps' tokens land
        self._fuse_weights()
        self._ops, self._ops_off = self._choose_ops(probed, options.fused_kernels)

    def _details(self) -> dict[str, object]:
        return {
            "kv_cache": "static",
            "kv_columns": self._cols,
            "cuda_graphs": self._use_graphs,
            "prefill_chunk_tokens": self._chunk,
            "overlap_decode": self._overlap,
            "fused_kernels": self._ops.name if self._ops_off is None else f"off: {self._ops_off}",
        }

    @torch.no_grad()
    def _choose_ops(self, model: Any, setting: str) -> tuple[fused.TorchOps, str | None]:
        """The element-wise ops of the forward pass (`fused.py`): the Triton kernels where
        `fused_kernels` allows them and they agree with torch on this model's shapes."""
        layer, dev = self._layers[0], next(model.parameters()).device
        heads = (self._n_heads, self._n_kv, self._head_dim)
        inner = int(self._wgu[0].shape[0]) // 2

        def check(ops: fused.TorchOps) -> None:
            with torch.inference_mode():
                fused.self_check(ops, layer.input_layernorm, layer.mlp.act_fn, heads, inner)

        ops, why = fused.choose(setting, dev, check)
        if why is not None and setting == "on":
            raise EngineError(f"fused_kernels=on, but the fused kernels cannot run: {why}")
        return ops, why

    @classmethod
    def limits_for(cls, loaded: LoadedModel, settings: TorchEngineSettings) -> EngineLimits:
        """The static KV cache's columns bound the sequence (and the prompt, one below)."""
        columns = static_kv_columns(loaded.model, settings, loaded.max_seq_len)
        return EngineLimits(
            min(loaded.max_input_len, columns - 1), columns, settings.max_batch_size
        )

    def _kv_tokens(self) -> int:
        return sum(self._lens) + sum(p.done for p in self._prefilling)

    def _free(self) -> None:
        self._graphs.clear()
        self._pool = None
        self._k = self._v = None
        self._layers, self._wqkv, self._wgu, self._lens = [], [], [], []
        self._prefilling = []
        self._launched, self._host_tok = None, []
        super()._free()

    @staticmethod
    def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
        return int(
            2
            * config.num_hidden_layers
            * llama.kv_heads_of(config)
            * llama.head_dim_of(config)
            * torch.empty((), dtype=dtype).element_size()
        )

    @torch.no_grad()
    def _fuse_weights(self) -> None:
        """One [q; k; v] and one [gate; up] matrix per layer: at batch 1 a decode step is
        a chain of matrix-vector products, and two big ones beat five small ones. The
        model's own projections become views into these (no extra memory), so the
        checkpoint's modules still compute the same function."""
        self._wqkv, self._wgu = [], []
        for layer in self._layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = [attn.q_proj, attn.k_proj, attn.v_proj]
            self._wqkv.append(self._fuse(projs))
            self._wgu.append(self._fuse([mlp.gate_proj, mlp.up_proj]))

    @staticmethod
    def _fuse(linears: list[torch.nn.Linear]) -> torch.Tensor:
        fused = torch.cat([lin.weight for lin in linears])
        start = 0
        for lin in linears:
            rows = lin.weight.shape[0]
            lin.weight = torch.nn.Parameter(fused[start : start + rows], requires_grad=False)
            start += rows
        return fused

    # ---- buffers (made on the engine thread, inside inference mode) ----

    def _on_thread_start(self) -> None:
        dev, dtype = self._device, next(self._model.parameters()).dtype
        shape = (len(self._layers), self._slots, self._n_kv, self._cols, self._head_dim)
        self._k = torch.zeros(shape, dtype=dtype, device=dev)
        self._v = torch.zeros(shape, dtype=dtype, device=dev)
        self._tok = torch.zeros(self._slots, dtype=torch.long, device=dev)
        self._posv = torch.zeros(self._slots, dtype=torch.long, device=dev)
        self._cols_range = torch.arange(self._cols, device=dev)
        if dev.type == "cuda":  # two: step k's tokens are read while step k+1's arrive
            self._host_tok = [
                torch.zeros(self._slots, dtype=torch.long, pin_memory=True) for _ in range(2)
            ]
        rot = self._model.model.rotary_emb
        self._inv_freq = rot.inv_freq.to(device=dev, dtype=torch.float32)
        self._rope_scale = float(getattr(rot, "attention_scaling", 1.0))

    def _kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The KV cache [layers, slots, kv heads, columns, head dim], keys and values."""
        assert self._k is not None and self._v is not None  # made at the thread's start
        return self._k, self._v

    # ---- our own forward pass over the model's modules ----

    def _rope(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self._inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (
            (emb.cos() * self._rope_scale).to(dtype).unsqueeze(-2),
            (emb.sin() * self._rope_scale).to(dtype).unsqueeze(-2),
        )  # [..., 1, D]: broadcast over the heads

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        row0: int,
        width: int,
        decode: bool,
    ) -> torch.Tensor:
        """Hidden states [n, T, H] for `ids` [n, T] at `positions` [n, T] of slots
        row0..row0+n-1, writing their keys/values into those slots. Decode (T == 1)
        attends to each row's columns up to its position, within the first `width`;
        prefill attends causally to columns 0..T-1 (a chunked prefill's step is
        `_mixed_forward`)."""
        n, t = ids.shape
        hq, hkv, d = self._n_heads, self._n_kv, self._head_dim
        x = self._model.model.embed_tokens(ids)
        cos, sin = self._rope(positions, x.dtype)  # [n, T, 1, head dim]
        slots = torch.arange(row0, row0 + n, device=ids.device)[:, None].expand(n, t)
        k_cache, v_cache = self._kv()
        h = self._ops.rms_norm(x, self._layers[0].input_layernorm)
        for i, layer in enumerate(self._layers):
            attn = layer.self_attn
            q, k, v = self._qkv(i, h)
            q, k = self._ops.rope(q.reshape(n, t, hq, d), k.reshape(n, t, hkv, d), cos, sin)
            kc, vc = k_cache[i], v_cache[i]
            kc[slots, :, positions] = k  # [n, T, hkv, d] at (slot, :, pos)
            vc[slots, :, positions] = v.reshape(n, t, hkv, d)
            if decode:  # one query per row (`fused.py`: the ops' decode attention)
                o = self._ops.decode_attention(
                    q.reshape(n, hq, d),
                    kc[row0 : row0 + n, :, :width],
                    vc[row0 : row0 + n, :, :width],
                    positions[:, 0],
                ).reshape(n, 1, hq * d)
            else:
                o = F.scaled_dot_product_attention(
                    q.transpose(1, 2),  # [n, hq, T, d]
                    kc[row0 : row0 + n, :, :t],
                    vc[row0 : row0 + n, :, :t],
                    is_causal=True,
                    enable_gqa=hkv != hq,
                )
                o = o.transpose(1, 2).reshape(n, t, hq * d)
            x, h = self._mlp(i, layer, x, attn.o_proj(o))
        return h  # the final norm's output (`_mlp` of the last layer)

    def _qkv(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's queries, keys and values of its normed input `h` (one fused
        projection), unrotated."""
        d = self._head_dim
        sizes = [self._n_heads * d, self._n_kv * d, self._n_kv * d]
        q, k, v = torch.split(F.linear(h, self._wqkv[i]), sizes, dim=-1)
        return q, k, v

    def _mlp(
        self, i: int, layer: Any, x: torch.Tensor, attn_out: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream `x` after layer i (its attention output `attn_out` added,
        then its MLP, fused gate/up projection) and the next norm of it (the next layer's
        input norm; after the last layer the model's final norm). Each add and the norm
        after it are one op (`fused.py`: one kernel where the fused kernels run)."""
        ops = self._ops
        x, h = ops.add_rms_norm(x, attn_out, layer.post_attention_layernorm)
        act = ops.act_mul(layer.mlp.act_fn, F.linear(h, self._wgu[i]))
        last = i + 1 == len(self._layers)
        norm = self._model.model.norm if last else self._layers[i + 1].input_layernorm
        return ops.add_rms_norm(x, layer.mlp.down_proj(act), norm)

    def _decode_width(self) -> int:
        """The columns a decode step of the running rows attends to: their longest row's
        next position, rounded up to a length bucket (one captured graph per bucket)."""
        return min(self._cols, math.ceil((max(self._lens) + 1) / LENGTH_BUCKET) * LENGTH_BUCKET)

    def _decode_logits(self, n: int, width: int) -> torch.Tensor:
        ids = self._tok[:n, None]
        pos = self._posv[:n, None]
        logits: torch.Tensor = self._model.lm_head(self._forward(ids, pos, 0, width, True)[:, 0])
        return logits

    # ---- the batch ----

    def _prefill_rows(self, seqs: list[_Sequence]) -> None:
        row0, n = len(self._running), len(seqs)
        width = max(len(s.prompt) for s in seqs)
        ids = torch.zeros((n, width), dtype=torch.long)
        for r, seq in enumerate(seqs):
            ids[r, : len(seq.prompt)] = torch.tensor(seq.prompt)
        ids = ids.to(self._device)
        positions = torch.arange(width, device=self._device)[None, :].expand(n, width)
        hidden = self._forward(ids, positions, row0, width, False)
        # Echo: the prompt's logits, from this same pass. Right-padded: a prompt's
        # positions are the first len(prompt) columns of its row.
        failures = self._prompt_logprobs(seqs, lambda r, seq: hidden[r, : len(seq.prompt)])
        last = torch.tensor([len(s.prompt) - 1 for s in seqs], device=self._device)
        logits = self._model.lm_head(hidden[torch.arange(n, device=self._device), last])
        self._committed = True  # the slots row0.. now belong to these requests
        self._running.extend(seqs)
        self._lens.extend(len(s.prompt) for s in seqs)
        self._posv[row0 : row0 + n] = torch.tensor(self._lens[row0:], device=self._device)
        self._advance(seqs, logits, first_row=row0, failures=failures)

    def _decode(self) -> None:
        profile = self._profile
        if profile is None:
            self._decode_step()
            return
        rows = len(self._running)
        constrained = any(s.mask_fn is not None for s in self._running)
        t0 = time.perf_counter()
        self._decode_step()
        kind = "constrained" if constrained else "plain"
        profile.add(f"step_{kind}", time.perf_counter() - t0)
        profile.count(f"rows_{kind}", rows)
        if constrained and self._overlap:
            profile.count("steps_overlap_lost")
        profile.flush(force=not self._running)

    def _decode_step(self) -> None:
        overlap = self._can_overlap()
        if not overlap:
            self._read_launched()  # before this step is launched: it may end rows
            if not self._running:
                return
        n = len(self._running)
        # self._posv holds each row's next position; its token sits in self._tok.
        width = self._decode_width()
        if self._use_graphs:
            bucket = min(self._slots, 1 << (n - 1).bit_length())
            logits = self._replay(bucket, width)[:n]
        else:
            logits = self._decode_logits(n, width)
        self._posv[:n] += 1
        for r in range(n):
            self._lens[r] += 1
        if overlap:
            self._overlap_step(logits)
        else:
            self._advance(list(self._running), logits, first_row=0)

    # ---- overlapped decode (overlap_decode) ----

    def _can_overlap(self) -> bool:
        return (
            self._overlap
            and bool(self._running)
            and not self._prefilling
            and all(plain_greedy(s) for s in self._running)
        )

    def _overlap_step(self, logits: torch.Tensor) -> None:
        """The step just launched picks its tokens on the device, as the next step's input;
        then the host takes the previous step's tokens while the GPU works."""
        n = len(self._running)
        tokens = greedy_tokens(logits.float())  # -1: a row without a finite logit
        self._tok[:n] = tokens.clamp_min(0)  # that row fails below; its input stays valid
        event = None
        if self._host_tok:
            host = self._host_tok[0][:n]
            self._host_tok.reverse()  # the other buffer may still hold the unread step
            host.copy_(tokens, non_blocking=True)
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch: unannotated
            event.record()
        else:
            host = tokens  # CPU: already computed
        previous, self._launched = self._launched, _Launched(list(self._running), host, event)
        if previous is not None:
            self._take_launched(previous)

    def _read_launched(self) -> None:
        """Take the tokens of the step under way, if any: before anything else changes the
        batch or launches a step whose rows must be the batch's rows then."""
        launched, self._launched = self._launched, None
        if launched is not None:
            self._take_launched(launched)

    def _take_launched(self, launched: _Launched) -> None:
        if launched.event is not None:
            launched.event.synchronize()
        tokens: list[int] = launched.tokens.tolist()
        rows = {id(seq): r for r, seq in enumerate(self._running)}
        # A sequence that left since (ended the step before, aborted) rode along: dropped.
        kept = [(rows[id(seq)], seq, t) for seq, t in zip(launched.seqs, tokens) if id(seq) in rows]
        self._take_picks(
            [seq for _, seq, _ in kept], [pick_of(t) for _, _, t in kept], [r for r, _, _ in kept]
        )

    def _replay(self, bucket: int, width: int) -> torch.Tensor:
        entry = self._graphs.get((bucket, width))
        if entry is None:
            try:
                entry = self._capture(bucket, width)
            except Exception as exc:  # noqa: BLE001 - run eagerly rather than not at all
                log.exception("CUDA graph capture failed; decoding without graphs from now on")
                self._use_graphs = False
                self.info.details["cuda_graphs"] = f"capture failed: {exc!r}"[:200]
                torch.cuda.synchronize()
                return self._decode_logits(bucket, width)
        graph, out = entry
        graph.replay()
        return out

    def _capture(self, bucket: int, width: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Rows past the running ones hold free slots: whatever a graph writes there
        # is overwritten by the prefill that takes the slot.
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch: Stream.__new__ is unannotated
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels / autotuning outside the capture
                self._decode_logits(bucket, width)
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = self._decode_logits(bucket, width)
        entry = self._graphs[(bucket, width)] = (graph, out)
        log.info("captured a CUDA graph for %d rows x %d columns", bucket, width)
        return entry

    # ---- structured output, batched ----

    def _advance(
        self,
        seqs: list[_Sequence],
        logits: torch.Tensor,
        first_row: int,
        failures: dict[int, Exception] | None = None,
    ) -> None:
        """TorchEngine's `_advance`, with the constrained rows masked together first
        (`guided_batch.py`). Called right after the step's forward pass was launched, so
        on a GPU the bitmask fill overlaps it."""
        rows = [i for i, s in enumerate(seqs) if self._batchable(s)] if self.batch_masks else []
        if self._profile is not None and any(s.mask_fn is not None for s in seqs):
            self._advance_timed(self._profile, seqs, logits, first_row, failures, rows)
        elif rows:
            self._advance_batched(seqs, logits, first_row, failures, rows)
        else:
            super()._advance(seqs, logits, first_row, failures)

    def _advance_batched(
        self,
        seqs: list[_Sequence],
        logits: torch.Tensor,
        first_row: int,
        failures: dict[int, Exception] | None,
        rows: list[int],
    ) -> None:
        if not rows:
            super()._advance(seqs, logits, first_row, failures)
            return
        logits = logits.float()  # what sampling works on (a copy unless float32 already)
        try:
            if self._masker is None:
                self._masker = BatchMasker(self._device, self._profile)
            # `mask_fn` is `GuidedMatcher.mask` (bound): its matcher, checked by `_batchable`.
            matchers: list[Any] = [getattr(seqs[i].mask_fn, "__self__", None) for i in rows]
            self._masker.mask(logits, rows, matchers)
        except Exception:  # noqa: BLE001 - each row then masks itself, as before
            log.exception("batched structured-output mask failed; masking row by row")
            super()._advance(seqs, logits, first_row, failures)
            return
        # These rows are masked now: the sampler sees them without a per-row mask (so a
        # greedy one takes the batched argmax); their matchers still accept the tokens.
        held = [(seqs[i], seqs[i].mask_fn) for i in rows]
        for seq, _ in held:
            seq.mask_fn = None
        try:
            super()._advance(seqs, logits, first_row, failures)
        finally:
            for seq, fn in held:
                seq.mask_fn = fn

    def _advance_timed(
        self,
        profile: guided_profile.GuidedProfile,
        seqs: list[_Sequence],
        logits: torch.Tensor,
        first_row: int,
        failures: dict[int, Exception] | None,
        rows: list[int],
    ) -> None:
        """`_advance_batched`, its parts timed (guided_profile.py): the rows' own masks
        and accepts are wrapped in timers for this call only."""
        batched = {id(seqs[i]) for i in rows}
        held = [(s, s.mask_fn, s.accept_fn) for s in seqs if s.mask_fn is not None]
        for seq, mask_fn, accept_fn in held:
            if id(seq) not in batched and mask_fn is not None:
                profile.count("fallback_rows")
                seq.mask_fn = profile.timed("rowmask", mask_fn)
            if accept_fn is not None:
                seq.accept_fn = profile.timed("accept", accept_fn)
        # Host time of the timed parts (h2d and apply are host-timed off a GPU only).
        parts = ("rowmask", "accept", "fill", "h2d", "apply")
        before = sum(profile.seconds[p] for p in parts)
        t0 = time.perf_counter()
        try:
            self._advance_batched(seqs, logits, first_row, failures, rows)
        finally:
            for seq, mask_fn, accept_fn in held:
                seq.mask_fn, seq.accept_fn = mask_fn, accept_fn
        inner = sum(profile.seconds[p] for p in parts) - before
        profile.add("sample", time.perf_counter() - t0 - inner)

    @staticmethod
    def _batchable(seq: _Sequence) -> bool:
        """A constrained row the batched mask serves exactly as its own mask would."""
        fn = seq.mask_fn
        return (
            fn is not None
            and hasattr(getattr(fn, "__self__", None), "xgrammar_matcher")
            and seq.sampling.logprobs is None
            and not (len(seq.generated) < seq.sampling.min_tokens and seq.stop_ids)
        )

    # ---- chunked prefill (prefill_chunk_tokens > 0) ----

    def _pass(self) -> bool:
        if self._launched is not None and (self._waiting or not self._can_overlap()):
            self._read_launched()  # its ended rows free their slots before admission
        if not self._chunk:
            return super()._pass()
        self._start_prefills()
        if self._prefilling:
            self._chunk_step()  # the running rows' decode rides in the chunk's forward
        elif self._running:
            self._decode()  # no prefill work: the captured decode graph, as without chunks
        return bool(self._running or self._prefilling)

    def stalled_for(self) -> float:
        if self._prefilling:
            return self._heartbeat.stalled_for(True)
        return super().stalled_for()

    def _fail_all(self, exc: BaseException) -> None:
        self._admitting = [*self._admitting, *(p.seq for p in self._prefilling)]
        self._prefilling = []
        self._launched = None  # its tokens are not read: every stream gets `exc`
        super()._fail_all(exc)

    def _drop_aborted(self) -> None:
        with self._lock:
            gone = [p for p in self._prefilling if p.seq.request_id in self._aborted]
            self._aborted.difference_update(p.seq.request_id for p in gone)
        for p in gone:
            self._prefilling.remove(p)
            p.seq.emit(TokenDelta([], "abort"))
        super()._drop_aborted()

    def _start_prefills(self) -> None:
        """Give waiting requests (oldest first) the free slots: the highest ones, so the
        running rows 0..n-1 can grow into the slots below them."""
        room = self._slots - len(self._running) - len(self._prefilling)
        if room <= 0:
            return
        with self._lock:
            seqs = [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]
        taken = {p.slot for p in self._prefilling}
        free = [s for s in range(self._slots - 1, len(self._running) - 1, -1) if s not in taken]
        for seq, slot in zip(seqs, free):
            echo = seq.sampling.prompt_logprobs is not None
            self._prefilling.append(_Prefilling(seq, slot, lps=[] if echo else None))
            # The decode graph also runs the free rows above the running ones: it writes
            # this slot's last column, which a prompt (at most columns - 1 tokens) never
            # holds and a later step overwrites before reading.
            self._posv[slot] = self._cols - 1

    def _chunk_step(self) -> None:
        """A step that carries prefill work: the running rows' next tokens and the next
        `prefill_chunk_tokens` prompt tokens (shared, oldest first) in one forward pass
        (`_prefill_pieces`). An allocation failure is retried as the decode alone, then
        each piece alone, so it ends only the request whose piece fails."""
        pieces, left = [], self._chunk
        for p in self._prefilling:
            if left <= 0:
                break
            count = min(len(p.seq.prompt) - p.done, left)
            pieces.append((p, count))
            left -= count
        self._mixed_committed = False
        try:
            self._prefill_pieces(pieces)
        except Exception as exc:
            # Retried only when nothing was committed (the pass's big allocations: forward,
            # echo logprobs, lm_head). After the commit the decode rows have stepped and the
            # pieces advanced: a retry would step them twice, so the failure is the engine's.
            if not is_allocation_failure(exc) or self._mixed_committed:
                raise
            retry = len(pieces) > 1 or bool(self._running)
            if self._running:
                self._decode()
            for piece in pieces if retry else []:
                try:
                    self._mixed_step([piece], decode=False)
                except Exception as one:
                    if not is_allocation_failure(one):
                        raise
                    self._end_prefill(piece[0], one)
            if not retry:
                self._end_prefill(pieces[0][0], exc)

    def _end_prefill(self, p: _Prefilling, exc: Exception) -> None:
        log.error("request %s failed in prefill: %r", p.seq.request_id, exc)
        self._prefilling.remove(p)
        p.seq.emit(EngineError(f"prefill failed for this request: {exc!r}"[:300]))

    def _prefill_pieces(self, pieces: list[tuple[_Prefilling, int]]) -> None:
        """The step's prompt pieces, with the running rows' decode in the same pass (the
        seam where tests count and fail a chunk step's passes)."""
        self._mixed_step(pieces, decode=True)

    def _mixed_step(self, pieces: list[tuple[_Prefilling, int]], decode: bool) -> None:
        """One forward pass over a flat token axis: the running rows' tokens (one each,
        when `decode`), then each piece's prompt tokens, packed without padding. The
        linear layers, norms and RoPE see all of them at once (one read of the weights);
        attention is split (`_mixed_forward`). Then, in the order the two-pass step had:
        the decode rows advance, finished prompts join the running rows and get their
        first token."""
        n = len(self._running) if decode else 0
        counts = [c for _, c in pieces]
        starts = [n + sum(counts[:r]) for r in range(len(pieces))]  # each piece's first token
        ids, pos, slots = self._flat_tokens(pieces, n)
        attention = self._piece_attention(pieces, starts, pos)
        decode_width = self._decode_width() if n else 0  # the decode step's length bucket
        hidden = self._mixed_forward(ids, pos, slots, (n, decode_width), attention)
        lps: dict[int, list[TokenLogprob]] = {}  # kept only once every piece succeeded
        for r, (p, c) in enumerate(pieces):
            if p.lps is not None:  # echo: this piece's positions, each predicting the next
                k = p.seq.sampling.prompt_logprobs or 0
                own = p.seq.prompt[p.done : p.done + c + 1]
                lps[r] = chunked_prompt_logprobs(
                    hidden[starts[r] : starts[r] + c], own, k, self._head, self._budget.chunk
                )
        # lm_head only where a token is sampled: the decode rows and each prompt's last token.
        finishing = [r for r, (p, c) in enumerate(pieces) if p.done + c == len(p.seq.prompt)]
        rows = [*range(n), *(starts[r] + counts[r] - 1 for r in finishing)]
        logits = (
            self._model.lm_head(hidden[torch.tensor(rows, device=self._device)]) if rows else None
        )
        self._mixed_committed = True  # from here on (see `_chunk_step`)
        self._take_mixed_step(pieces, lps, n, [pieces[r][0] for r in finishing], logits)

    def _flat_tokens(
        self, pieces: list[tuple[_Prefilling, int]], n: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The ids, positions and slots of a mixed step's flat token axis: the first `n`
        running rows' next tokens, then the pieces' prompt tokens."""
        dev = self._device
        # The decode rows' tokens and positions are on the device already (`_tok`, `_posv`).
        prompt_ids = [t for p, c in pieces for t in p.seq.prompt[p.done : p.done + c]]
        prompt_pos = [j for p, c in pieces for j in range(p.done, p.done + c)]
        ids = torch.cat([self._tok[:n], torch.tensor(prompt_ids).to(dev)])
        pos = torch.cat([self._posv[:n], torch.tensor(prompt_pos).to(dev)])
        slots = torch.tensor([*range(n), *(p.slot for p, c in pieces for _ in range(c))]).to(dev)
        return ids, pos, slots

    def _piece_attention(
        self, pieces: list[tuple[_Prefilling, int]], starts: list[int], pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the pieces' attention needs (`_mixed_forward`'s `pieces`): each one's slot,
        and its queries padded to [pieces, t] with their mask."""
        dev = self._device
        counts = [c for _, c in pieces]
        # `gather` is each padded query's token on the flat axis (padding repeats the piece's
        # last token, so its mask row is a real one; its output is dropped), `valid` the
        # real ones.
        t = max(counts)
        gather = torch.tensor(
            [[s + min(j, c - 1) for j in range(t)] for s, c in zip(starts, counts)]
        )
        valid = torch.arange(t)[None, :] < torch.tensor(counts)[:, None]
        gather, valid = gather.to(dev), valid.to(dev)
        width = max(p.done + c for p, c in pieces)
        piece_mask = self._cols_range[:width][None, None, None, :] <= pos[gather][:, None, :, None]
        piece_slots = torch.tensor([p.slot for p, _ in pieces], device=dev)
        return piece_slots, gather, valid, piece_mask

    def _take_mixed_step(
        self,
        pieces: list[tuple[_Prefilling, int]],
        lps: dict[int, list[TokenLogprob]],
        n: int,
        done: list[_Prefilling],
        logits: torch.Tensor | None,
    ) -> None:
        """After a mixed step's pass, in the order the two-pass step had: the pieces' progress
        (and prompt logprobs), the `n` decode rows advance, then the prompts `done` join the
        running rows and get their first token."""
        for r, (p, c) in enumerate(pieces):
            if p.lps is not None:
                p.lps += lps[r]
            p.done += c
        if n:
            assert logits is not None
            self._posv[:n] += 1
            for r in range(n):
                self._lens[r] += 1
            self._advance(list(self._running), logits[:n], first_row=0)
        if not done:
            return
        assert logits is not None
        first_row = len(self._running)
        for p in done:
            self._join_prefilled(p)
        self._advance([p.seq for p in done], logits[n:], first_row=first_row)

    def _mixed_forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        decode: tuple[int, int],
        pieces: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Final hidden states [N, H] of N tokens `ids` [N] at `positions` [N] in `slots`
        [N], writing their keys/values there. The first n (`decode` = (n, width)) are the
        running rows 0..n-1's next tokens and attend as in `_forward`'s decode; the rest
        are prompt pieces (`pieces` = (slot of each piece [m], gather [m, t], valid [m, t],
        mask [m, 1, t, width])), whose queries attend, padded to [m, t], to their slot's
        columns under that mask."""
        n, decode_width = decode
        piece_slots, gather, valid, piece_mask = pieces
        total = ids.shape[0]
        hq, hkv, d = self._n_heads, self._n_kv, self._head_dim
        width = piece_mask.shape[-1]
        x = self._model.model.embed_tokens(ids)  # [N, H]
        cos, sin = self._rope(positions, x.dtype)  # [N, 1, head dim]: broadcast over heads
        k_cache, v_cache = self._kv()
        h = self._ops.rms_norm(x, self._layers[0].input_layernorm)
        for i, layer in enumerate(self._layers):
            attn = layer.self_attn
            q, k, v = self._qkv(i, h)
            q, k = self._ops.rope(q.reshape(total, hq, d), k.reshape(total, hkv, d), cos, sin)
            kc, vc = k_cache[i], v_cache[i]
            kc[slots, :, positions] = k  # [N, hkv, d] at (slot, :, position)
            vc[slots, :, positions] = v.reshape(total, hkv, d)
            outs = []
            if n:
                outs.append(
                    self._ops.decode_attention(
                        q[:n], kc[:n, :, :decode_width], vc[:n, :, :decode_width], positions[:n]
                    )
                )
            o = F.scaled_dot_product_attention(
                q[gather].transpose(1, 2),  # [m, hq, t, d]
                kc[piece_slots, :, :width],
                vc[piece_slots, :, :width],
                attn_mask=piece_mask,
                enable_gqa=hkv != hq,
            )
            # Back to the flat axis: the real queries, row by row (= packed order).
            outs.append(o.transpose(1, 2)[valid].reshape(-1, hq * d))
            x, h = self._mlp(i, layer, x, attn.o_proj(torch.cat(outs) if n else outs[0]))
        return h

    def _join_prefilled(self, p: _Prefilling) -> None:
        """`p`'s prompt is in its slot: it becomes running row n (its columns moved there;
        a prefill under way in row n swaps slots with it)."""
        row, cols = len(self._running), len(p.seq.prompt)
        self._prefilling.remove(p)
        if p.slot != row:
            kc, vc = self._kv()
            other = next((q for q in self._prefilling if q.slot == row), None)
            if other is not None:
                k = kc[:, row, :, : other.done].clone()
                v = vc[:, row, :, : other.done].clone()
            kc[:, row, :, :cols] = kc[:, p.slot, :, :cols]
            vc[:, row, :, :cols] = vc[:, p.slot, :, :cols]
            if other is not None:
                kc[:, p.slot, :, : other.done] = k
                vc[:, p.slot, :, : other.done] = v
                other.slot = p.slot
                self._posv[p.slot] = self._cols - 1
        seq = p.seq
        seq.prompt_lps = p.lps
        self._running.append(seq)
        self._lens.append(cols)
        self._posv[row] = cols

    def _store_tokens(self, first_row: int, tokens: list[int]) -> None:
        self._tok[first_row : first_row + len(tokens)] = torch.tensor(tokens).to(
            self._device, non_blocking=True
        )

    def _select(self, rows: list[int]) -> None:
        """Keep these rows: fill each hole below the new count with the last kept row."""
        keep = set(rows)
        m = len(rows)
        holes = [i for i in range(m) if i not in keep]
        movers = [i for i in rows if i >= m]  # kept rows that must move down
        k_cache, v_cache = self._kv()
        for dst, src in zip(holes, movers):
            cols = self._lens[src]
            k_cache[:, dst, :, :cols] = k_cache[:, src, :, :cols]
            v_cache[:, dst, :, :cols] = v_cache[:, src, :, :cols]
            self._running[dst], self._lens[dst] = self._running[src], self._lens[src]
        if holes:  # non_blocking: a blocking copy would wait for the step under way
            dst_t = torch.tensor(holes).to(self._device, non_blocking=True)
            src_t = torch.tensor(movers).to(self._device, non_blocking=True)
            self._tok[dst_t] = self._tok[src_t]
            self._posv[dst_t] = self._posv[src_t]
        del self._running[m:], self._lens[m:]


@dataclass(frozen=True)
class _Launched:
    """A decode step launched with overlap: its rows (in launch order) and their tokens,
    on the host once `event` (None on the CPU) has passed."""

    seqs: list[_Sequence]
    tokens: torch.Tensor
    event: torch.cuda.Event | None


@dataclass(eq=False)
class _Prefilling:
    """A prompt being prefilled in chunks: its slot, and how much of it is there."""

    seq: _Sequence
    slot: int
    done: int = 0  # prompt tokens whose keys and values are in the slot
    lps: list[TokenLogprob] | None = None  # echo: the prompt logprobs so far


def static_kv_columns(model: torch.nn.Module, settings: TorchEngineSettings, max_seq: int) -> int:
    """Columns (tokens per sequence) of the static KV cache: `max_seq_len` when set, else
    what `kv_cache_free_gpu_memory_fraction` of the free GPU memory holds for
    `max_batch_size` slots (8 GiB on the CPU), never above the model's positions."""
    if settings.max_seq_len:
        return max_seq
    param = next(model.parameters())
    per_token = StaticTorchEngine.kv_bytes_per_token(model.config, param.dtype)
    if param.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(param.device)
        budget = free * settings.kv_cache_free_gpu_memory_fraction - 4 * 2**30  # activations
    else:
        budget = 8 * 2**30
    columns = int(budget // (per_token * settings.max_batch_size))
    columns = columns // LENGTH_BUCKET * LENGTH_BUCKET
    if columns < LENGTH_BUCKET:
        raise EngineError(
            f"a static KV cache for {settings.max_batch_size} sequences does not fit in "
            f"{budget / 2**30:.1f} GiB: lower max_batch_size or set max_seq_len"
        )
    return min(max_seq, columns)
