"""A Llama/Mistral decoder's modules as the static engine reads them, without
transformers' modeling code.

The static engine runs its own forward pass (`static._forward`) over the
checkpoint's modules; it needs their parameters, the RMSNorms, the activation and the
rotary tables, not transformers' `MistralForCausalLM`. Importing that class pulls in
transformers' generation and tensor-parallel code (torch.distributed.tensor's custom-op
registration, scikit-learn, sympy): most of a warm engine start
(docs/perf/history/round-03.md). These modules carry the same parameter names, shapes and numerics
(RMSNorm in float32 as transformers computes it; the rotary inverse frequencies from
transformers' own formulas), so a checkpoint loads into them unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ACTIVATIONS = {"silu": nn.SiLU}


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, **where: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, **where))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # transformers' LlamaRMSNorm/MistralRMSNorm, step for step.
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, **where: Any) -> None:
        super().__init__()
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False, **where)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False, **where)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False, **where)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False, **where)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, activation: str, **where: Any) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False, **where)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False, **where)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False, **where)
        self.act_fn = ACTIVATIONS[activation]()


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, head_dim: int, **where: Any) -> None:
        super().__init__()
        hidden = config.hidden_size
        heads = config.num_attention_heads
        self.self_attn = Attention(hidden, heads, kv_heads_of(config), head_dim, **where)
        self.mlp = MLP(hidden, config.intermediate_size, config.hidden_act, **where)
        self.input_layernorm = RMSNorm(hidden, config.rms_norm_eps, **where)
        self.post_attention_layernorm = RMSNorm(hidden, config.rms_norm_eps, **where)


class RotaryTables(nn.Module):
    """The inverse frequencies and scale of the config's RoPE, as transformers computes
    them (`inv_freq`, `attention_scaling`, `rope_type`: what the static engine reads)."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.rope_type = rope_type(config)
        if self.rope_type == "default":
            # transformers' compute_default_rope_parameters.
            dim = head_dim_of(config)
            theta = rope_parameters(config).get("rope_theta")
            base = float(theta if theta else getattr(config, "rope_theta", 1e4))
            arange = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float)
            inv_freq, scaling = 1.0 / (base ** (arange / dim)), 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = float(scaling)


class Decoder(nn.Module):
    def __init__(self, config: Any, **where: Any) -> None:
        super().__init__()
        head_dim = head_dim_of(config)
        # `_weight`: no random init (on the meta device nn.Embedding's normal_ imports
        # torch._dynamo, ~1 s; nn.Linear's init there does not).
        weight = torch.empty(config.vocab_size, config.hidden_size, **where)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(
            DecoderLayer(config, head_dim, **where) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **where)
        self.rotary_emb = RotaryTables(config)


class CausalLM(nn.Module):
    """`model.model.{embed_tokens, layers, norm, rotary_emb}` and `model.lm_head`, with
    the checkpoint's names, made on `device` in `dtype` without initialising them (the
    loader makes them on the meta device and copies the checkpoint in). It has no
    forward pass of its own: the static engine's is the only one."""

    def __init__(self, config: Any, device: str | torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        where = {"device": device, "dtype": dtype}
        self.config = config
        self.model = Decoder(config, **where)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **where)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the static engine runs its own forward pass")


def allocate(model: nn.Module, device: torch.device) -> None:
    """Give every parameter of a model made on the meta device uninitialised memory on
    `device`. (`Module.to_empty` does the same through torch's reference `empty_like`,
    which imports sympy and torch.fx's symbolic shapes: ~0.3-1 s of a start.)"""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None:
                fresh = torch.empty(p.shape, dtype=p.dtype, device=device)
                module._parameters[name] = nn.Parameter(fresh, requires_grad=p.requires_grad)


def unsupported(config: Any) -> str | None:
    """None if these modules can hold this config's checkpoint, else why not."""
    activation = getattr(config, "hidden_act", "silu")  # transformers' Llama/Mistral default
    if activation not in ACTIVATIONS:
        return f"activation {activation}"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "the projections have biases"
    if getattr(config, "sliding_window", None):
        return "sliding-window attention"
    kind = rope_type(config)
    if kind not in ("default", "linear", "llama3"):
        return f"rope type {kind}"
    return None


# config.json keys these modules read that transformers' base config class lacks or
# defaults differently from the model's own class (Mistral's num_key_value_heads 8 and
# sliding_window 4096, the base class's tie_word_embeddings True, hidden_act's silu).
_CONFIG_KEYS = (
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "rms_norm_eps",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)
_CONFIG_KEYS_BY_TYPE = {"mistral": ("sliding_window",)}  # Llama's config has no such field


def config_keys_without_shared_defaults(raw: dict[str, Any]) -> tuple[str, ...]:
    """The keys config.json must hold for these modules to read it through transformers'
    base config class (`static.light_config`) as the model's own class would."""
    return (*_CONFIG_KEYS, *_CONFIG_KEYS_BY_TYPE.get(str(raw.get("model_type")), ()))


def rope_parameters(config: Any) -> dict[str, Any]:
    """transformers 5 keeps RoPE in `rope_parameters`; 4.x in `rope_scaling`/`rope_theta`."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return params if isinstance(params, dict) else {}


def rope_type(config: Any) -> str:
    params = rope_parameters(config)
    return str(params.get("rope_type", params.get("type", "default")))


def head_dim_of(config: Any) -> int:
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def kv_heads_of(config: Any) -> int:
    return int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
