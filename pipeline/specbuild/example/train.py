"""Training and measuring the example pair: the target learns next-token prediction on the corpus,
the draft is distilled from it (KL to the target's logits, mixed with the data loss).

Measurements stored in example.json:
- agreement: greedy per-token agreement on held-out prompts. The target greedily continues each
  prompt; both models then score prompt + continuation in one pass (teacher forcing), and we count
  the continuation positions where the draft's argmax equals the target's.
- cost ratio c = draft decode step time / target decode step time (batch 1, KV cache, this CPU).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from specbuild import corpus
from specbuild.example.recipe import ModelShape, Recipe
from specbuild.example.tokenizer import BOS_ID, EOS_ID, PAD_ID

Tick = Callable[..., None]  # tick(steps, **figures): one call per optimizer step, with its losses


def make_model(shape: ModelShape, vocab_size: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float()


def param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def token_stream(tok, recipe: Recipe) -> torch.Tensor:
    """All training documents as one id stream, each document <s> ... </s>, in a seeded order."""
    docs = corpus.training_documents(recipe.json_records)
    code = docs["code"][: recipe.code_files] if recipe.code_files else docs["code"]
    records = docs["json"]
    jsonl = ["\n".join(records[i : i + 8]) + "\n" for i in range(0, len(records), 8)]
    texts = code + docs["prose"] + jsonl
    random.Random(recipe.seed).shuffle(texts)
    ids: list[int] = []
    for encoding in tok.encode_batch(texts):  # the post-processor already prepends <s>
        ids.extend(encoding.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)  # [n_tokens]


def training_texts(recipe: Recipe) -> list[str]:
    """What the tokenizer is trained on: the same documents the models see."""
    docs = corpus.training_documents(recipe.json_records)
    code = docs["code"][: recipe.code_files] if recipe.code_files else docs["code"]
    return code + docs["prose"] + docs["json"]


def _optimizer(model, lr: float, embed_lr_mult: float) -> torch.optim.Optimizer:
    """AdamW; token embeddings and lm_head get `embed_lr_mult` x the rate and no weight decay.

    With one small rate for everything, a freshly initialised model sits for hundreds of steps at
    the unigram loss (its output rows must grow large before logits can separate); a faster rate
    for those two matrices gets it past that in tens of steps.
    """
    fast, rest = [], []
    for name, param in model.named_parameters():
        (fast if "embed_tokens" in name or "lm_head" in name else rest).append(param)
    groups = [
        {"params": rest, "lr_mult": 1.0, "weight_decay": 0.1},
        {"params": fast, "lr_mult": embed_lr_mult, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr * group["lr_mult"]


def _lr(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _batch(stream: torch.Tensor, recipe: Recipe, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - recipe.seq_len - 1, (recipe.batch_size,), generator=gen)
    return torch.stack([stream[s : s + recipe.seq_len] for s in starts.tolist()])  # [batch, seq]


def _ce(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    # logits: [batch, seq, vocab]; ids: [batch, seq]; position t predicts ids[t + 1]
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())


def _draft_loss(draft_logits: torch.Tensor, teacher_logits: torch.Tensor, ids: torch.Tensor, w: float) -> torch.Tensor:
    # draft_logits, teacher_logits: [batch, seq, vocab]
    log_q = F.log_softmax(draft_logits[:, :-1].flatten(0, 1), dim=-1)
    log_p = F.log_softmax(teacher_logits[:, :-1].flatten(0, 1), dim=-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    return w * kl + (1 - w) * _ce(draft_logits, ids)


def train_pair(recipe: Recipe, stream: torch.Tensor, tick: Tick) -> tuple[Any, Any, dict[str, Any]]:
    """Train the target and, alongside it, the draft; then distil the draft against the final target."""
    target = make_model(recipe.target, recipe.vocab_size, recipe.seed)
    draft = make_model(recipe.draft, recipe.vocab_size, recipe.seed + 1)
    opt_t = _optimizer(target, recipe.target_lr, recipe.embed_lr_mult)
    opt_d = _optimizer(draft, recipe.draft_lr, recipe.embed_lr_mult)
    gen = torch.Generator().manual_seed(recipe.seed)
    d_total = recipe.target_steps + recipe.distill_steps
    losses: dict[str, list[float]] = {"target": [], "draft": []}
    target.train()
    draft.train()
    for step in range(d_total):
        ids = _batch(stream, recipe, gen)
        if step < recipe.target_steps:
            _set_lr(opt_t, _lr(step, recipe.target_steps, recipe.target_lr, recipe.warmup_steps))
            logits = target(input_ids=ids).logits
            loss_t = _ce(logits, ids)
            loss_t.backward()
            torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
            opt_t.step()
            opt_t.zero_grad(set_to_none=True)
            teacher = logits.detach()
            losses["target"].append(loss_t.item())
        else:
            target.eval()
            with torch.no_grad():
                teacher = target(input_ids=ids).logits
        _set_lr(opt_d, _lr(step, d_total, recipe.draft_lr, recipe.warmup_steps))
        loss_d = _draft_loss(draft(input_ids=ids).logits, teacher, ids, recipe.distill_weight)
        loss_d.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt_d.step()
        opt_d.zero_grad(set_to_none=True)
        losses["draft"].append(loss_d.item())
        tick(1, loss=f"{losses['target'][-1]:.3f}/{losses['draft'][-1]:.3f}")
    target.eval()
    draft.eval()
    tail = max(1, recipe.target_steps // 10)
    stats = {
        "final_target_train_loss": round(statistics.fmean(losses["target"][-tail:]), 4),
        "final_draft_train_loss": round(statistics.fmean(losses["draft"][-tail:]), 4),
        "tokens_seen": d_total * recipe.batch_size * recipe.seq_len,
    }
    return target, draft, stats


@torch.no_grad()
def round_to_storage(model, dtype_name: str) -> None:
    """Round every weight to `dtype_name` precision in place (kept float32): float16 -> float32 is exact,
    so the weights measured here are bit for bit the ones a float16 copy unpacks to."""
    dtype = getattr(torch, dtype_name)
    for param in model.parameters():
        param.copy_(param.to(dtype).to(torch.float32))


@torch.no_grad()
def _greedy(model, ids: list[int], new_tokens: int) -> list[int]:
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    cache, generated = out.past_key_values, []
    for _ in range(new_tokens):
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        if token == EOS_ID:
            break
        out = model(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    return generated


@torch.no_grad()
def measure_agreement(target, draft, tok, recipe: Recipe, prompt_tokens: int = 96) -> dict[str, Any]:
    """Greedy per-token agreement of draft with target on held-out prompts (see the module docstring).

    Also reported, so a degenerate target (one that greedily repeats itself) shows: the same
    agreement measured on the held-out text itself (`agreement_on_text`), each model's loss on that
    text, the share of distinct tokens in the greedy continuations, and one decoded continuation per kind.
    """
    matches: dict[str, list[int]] = {}
    on_text: list[int] = []
    nll: dict[str, list[float]] = {"target": [], "draft": []}
    distinct: list[float] = []
    samples: dict[str, str] = {}
    for kind, count in recipe.eval_prompts.items():
        matches[kind] = []
        for prompt in corpus.heldout_prompts(kind, count, chars=prompt_tokens * 4):
            ids = tok.encode(prompt).ids[:prompt_tokens]
            continuation = _greedy(target, ids, recipe.eval_new_tokens)
            samples.setdefault(kind, tok.decode(continuation))
            distinct.append(len(set(continuation)) / max(1, len(continuation)))
            full = torch.tensor([ids + continuation])  # [1, prompt + new]
            t_logits, d_logits = target(input_ids=full).logits[0], draft(input_ids=full).logits[0]
            positions = slice(len(ids) - 1, len(ids) - 1 + len(continuation))
            matches[kind].extend((t_logits[positions].argmax(-1) == d_logits[positions].argmax(-1)).tolist())
            n = len(ids)
            on_text.extend((t_logits[: n - 1].argmax(-1) == d_logits[: n - 1].argmax(-1)).tolist())
            prompt_ids = full[:, :n]
            nll["target"].append(_ce(t_logits[None, :n], prompt_ids).item())
            nll["draft"].append(_ce(d_logits[None, :n], prompt_ids).item())
    every = [m for kind in matches for m in matches[kind]]
    return {
        "agreement": round(sum(every) / len(every), 4),
        "agreement_by_kind": {k: round(sum(v) / len(v), 4) for k, v in matches.items() if v},
        "agreement_on_text": round(sum(on_text) / len(on_text), 4),
        "positions": len(every),
        "heldout_loss": {k: round(statistics.fmean(v), 4) for k, v in nll.items()},
        "continuation_distinct_ratio": round(statistics.fmean(distinct), 4),
        "samples": samples,
    }


@torch.no_grad()
def measure_cost_ratio(target, draft, steps: int = 24, rounds: int = 3) -> dict[str, float]:
    """c = draft decode step / target decode step at batch 1 with a KV cache (median per round, best round)."""

    def step_times(model) -> list[float]:
        ids = torch.arange(4, 68)[None]  # [1, 64]: any valid ids
        out = model(input_ids=ids, use_cache=True)
        cache, times = out.past_key_values, []
        token = out.logits[:, -1:].argmax(-1)
        for _ in range(steps):
            start = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - start)
            cache = out.past_key_values
        return times

    target_ms, draft_ms = [], []
    for _ in range(rounds):  # interleaved, so a busy moment on the machine hits both
        target_ms.append(1000 * statistics.median(step_times(target)))
        draft_ms.append(1000 * statistics.median(step_times(draft)))
    t, d = min(target_ms), min(draft_ms)
    return {"target_step_ms": round(t, 3), "draft_step_ms": round(d, 3), "cost_ratio": round(d / t, 4)}
