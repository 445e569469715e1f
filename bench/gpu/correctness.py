"""Is the static engine's greedy decoding right? Its sequences teacher-forced through an
fp32 reference: at each generated position, is the engine's token the fp32 argmax, and how
far below the fp32 maximum is its fp32 logit (regret)? Plain HF bf16 (the model's own
forward over the same sequences, its argmax as the choice) is the calibration: random
weights make near-ties common, so neither is exact; the engine must be no worse."""

from __future__ import annotations

import asyncio

from bench.gpu.common import emit, id_prompts


def greedy_sequences(engine, prompts: list[list[int]], out_len: int) -> list[list[int]]:
    """Each prompt's greedy continuation from the engine, all submitted at once (so the
    batched, graph-replayed decode path makes them)."""
    from mistral_serving.engines.base import SamplingOptions

    async def one(i: int, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        options = SamplingOptions(max_new_tokens=out_len, top_k=1)
        async for delta in engine.generate(f"check{i}", prompt, options):
            tokens += delta.token_ids
        return tokens

    async def every():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(every())


def hf_copy(model, dtype=None):
    """The engine's weights in transformers' own model class (the static engine's modules
    have no forward pass of their own), on the same device, in `dtype` (default: the
    weights' own; bf16 -> fp32 is exact)."""
    import copy

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

    config = copy.deepcopy(model.config)
    if type(config) is PretrainedConfig:  # the static loader's base class: the model's own
        fields = {k: v for k, v in config.to_dict().items() if k != "model_type"}
        config = AutoConfig.for_model(config.model_type, **fields)
    dtype = dtype or next(model.parameters()).dtype
    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(config, dtype=dtype)
    device = next(model.parameters()).device
    ref.to_empty(device=device)
    ref.load_state_dict(model.state_dict())
    ref.model.rotary_emb = type(ref.model.rotary_emb)(ref.config).to(device)
    return ref.eval()


def teacher_forced_logits(model, seqs: list[list[int]], batch: int = 8):
    """Logits [n, T, V] (float32) of each sequence fed whole; right-padded, causal, so
    every real position sees only its own prefix."""
    import torch

    device = next(model.parameters()).device
    width = max(len(s) for s in seqs)
    out = []
    with torch.no_grad():
        for i in range(0, len(seqs), batch):
            ids = torch.zeros((len(seqs[i : i + batch]), width), dtype=torch.long)
            for r, s in enumerate(seqs[i : i + batch]):
                ids[r, : len(s)] = torch.tensor(s)
            out.append(model(ids.to(device)).logits.float())
    return torch.cat(out)


def correctness_check(engine, model, args) -> None:
    """The engine's greedy sequences, their logits in fp32 and in plain HF bf16, and the
    `correctness` row comparing the two choices."""
    import gc

    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # a true fp32 reference
    torch.backends.cudnn.allow_tf32 = False
    n, in_len, out_len = (4, 32, 16) if args.quick else (32, 128, 128)
    prompts = id_prompts(n, in_len, seed=11)
    outs = greedy_sequences(engine, prompts, out_len)
    # The engine stays (idle): bf16 weights + KV cache + an fp32 copy fit on an H200.
    kept = [(p, o) for p, o in zip(prompts, outs) if o]
    seqs = [p + o[:-1] for p, o in kept]  # the last token is not fed back
    hf_model = hf_copy(model)
    bf16 = teacher_forced_logits(hf_model, seqs)
    del hf_model
    ref_model = hf_copy(model, torch.float32)
    ref = teacher_forced_logits(ref_model, seqs)
    del ref_model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    emit(figure="correctness", engine=type(engine).__name__, sequences=len(seqs),
         **agreement(kept, ref, bf16))  # fmt: skip


def agreement(kept: list[tuple[list[int], list[int]]], ref, bf16) -> dict:
    """The engine's choices (the generated tokens of `kept`'s (prompt, output) pairs)
    against the fp32 reference logits `ref`, with HF bf16's argmax (`bf16`) beside them."""
    import torch

    picks, rows = [], []
    for i, (p, o) in enumerate(kept):
        for j, token in enumerate(o):
            rows.append((i, len(p) - 1 + j))  # the logits that chose token j
            picks.append(token)
    idx_i = torch.tensor([r[0] for r in rows])
    idx_t = torch.tensor([r[1] for r in rows])
    ref_rows = ref[idx_i, idx_t]  # [positions, V]
    hf_rows = bf16[idx_i, idx_t]
    chosen = torch.tensor(picks, device=ref_rows.device)
    hf_chosen = hf_rows.argmax(-1)
    best = ref_rows.max(-1)
    regret = best.values - ref_rows.gather(1, chosen[:, None])[:, 0]
    hf_regret = best.values - ref_rows.gather(1, hf_chosen[:, None])[:, 0]

    def q(x, p):
        return round(float(torch.quantile(x.float().cpu(), p)), 4)

    exact = float((chosen == best.indices).float().mean()) * 100
    hf_exact = float((hf_chosen == best.indices).float().mean()) * 100
    return dict(
        positions=len(picks),
        engine_exact_argmax_pct=round(exact, 1),
        hf_bf16_exact_argmax_pct=round(hf_exact, 1),
        engine_regret_p50=q(regret, 0.5),
        engine_regret_p99=q(regret, 0.99),
        engine_regret_max=round(float(regret.max()), 4),
        hf_bf16_regret_p50=q(hf_regret, 0.5),
        hf_bf16_regret_p99=q(hf_regret, 0.99),
        hf_bf16_regret_max=round(float(hf_regret.max()), 4),
        engine_equals_hf_bf16_pct=round(float((chosen == hf_chosen).float().mean()) * 100, 1),
        ref_logit_spread_p50=q(best.values - ref_rows.mean(-1), 0.5),
        no_worse_than_hf_bf16=bool(
            exact >= hf_exact - 1.0 and q(regret, 0.99) <= q(hf_regret, 0.99) * 1.1 + 1e-3
        ),
    )
