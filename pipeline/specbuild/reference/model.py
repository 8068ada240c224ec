"""A compact Llama forward pass in PyTorch, over per-sequence KV caches.

The architecture follows Hugging Face `LlamaForCausalLM` (modeling_llama.py): RMSNorm, rotary
position embeddings (rope types "default", "linear" and "llama3"), grouped-query attention, SiLU
gated MLP, optionally tied embeddings. Weights come from an HF-layout folder (config.json +
*.safetensors): a reference engine or the Hugging Face checkpoint itself.

Batch invariance. A row's numbers never depend on which other rows share its forward pass:
- every matmul runs on row blocks of a fixed size (`row_block`), padded with zero rows, because
  BLAS libraries pick different kernels (different summation orders) for different row counts;
- attention runs on blocks of `row_block` query rows over the keys up to a fixed bucket end
  (the next multiple of 64 past the query's position), later positions masked out: a query sees
  the same shapes whether it is decoded alone, verified among k + 1 draft positions or prefilled
  (the key length depends on the position only).
A fixed shape is necessary but not sufficient: a row's result must also not depend on its place in
the block or on the other rows, and that is up to the BLAS code path the CPU gets. So the block is
chosen by probing this machine (reference/exactness.py) when the model is made: the first candidate
that passes, else one row per call. Then the logits at a position are bit-identical whether it is
computed in a prompt prefill, in one-token decoding, in a (k + 1)-token verification, next to other
sequences, or after a KV rollback: speculative greedy output equals target-only output token for
token, and outputs are identical with and without the caches (tests/test_runtime_invariance.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specbuild import families
from specbuild.errors import CheckpointError
from specbuild.reference.blocks import key_bucket_end, run_blocks
from specbuild.reference.kvcache import SequenceKV


@dataclass(frozen=True)
class LlamaArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope: dict[str, Any]  # rope_scaling / rope_parameters ({} = plain rope)
    tie_word_embeddings: bool
    max_position_embeddings: int
    # what the family computes differently from Llama (specbuild.families)
    qk_norm: bool = False  # RMSNorm over each head's q and k before rope
    norm_offset: bool = False  # RMSNorm scales by (1 + weight)
    embed_scale: bool = False  # embeddings times sqrt(hidden_size)
    activation: str = "silu"  # "silu" or "gelu_tanh"
    windows: tuple[int | None, ...] = ()  # per layer: a query attends to the last window positions (None: all)
    sandwich_norms: bool = False  # attention output and MLP output normalized too (Gemma 2)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2)
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    query_scale: float | None = None  # q.k scale (None: head_dim ** -0.5)

    @property
    def sliding_window(self) -> int | None:
        """The window of the layers that slide (None: none does)."""
        return next((w for w in self.windows if w is not None), None)


def args_from_config(config: dict[str, Any], where: str) -> LlamaArgs:
    """The model's shape and family facts; CheckpointError when the reference runtime does not compute it
    (families.support, the rule `check` and `convert` apply too)."""
    arch = (config.get("architectures") or [None])[0]
    verdict = families.support(arch, config, "runtime", max_seq_len=None)
    if not verdict.ok:
        raise CheckpointError(f"{where}: {verdict.reason}; {verdict.fix}.")
    family = families.family_of(arch)
    rope = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    return LlamaArgs(
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=int(config["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rope=rope,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        qk_norm=family.qk_norm,
        norm_offset=family.norm_offset,
        embed_scale=family.embed_scale,
        activation=families.ACTIVATIONS[families.activation(family, config)],
        windows=families.layer_windows(family, config, int(config["num_hidden_layers"])),
        sandwich_norms=family.sandwich_norms,
        attn_softcap=_float_or_none(config.get("attn_logit_softcapping")) if family.softcapping else None,
        final_softcap=_float_or_none(config.get("final_logit_softcapping")) if family.softcapping else None,
        query_scale=float(config[family.query_scale_key]) ** -0.5 if family.query_scale_key else None,
    )


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def rope_inv_freq(args: LlamaArgs) -> torch.Tensor:
    """[head_dim // 2] inverse frequencies, as transformers' rope init functions compute them."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rope_type = args.rope.get("rope_type", args.rope.get("type", "default"))
    if rope_type == "linear":
        return inv_freq / float(args.rope["factor"])
    if rope_type != "llama3":
        return inv_freq
    factor = float(args.rope["factor"])
    low, high = float(args.rope["low_freq_factor"]), float(args.rope["high_freq_factor"])
    old_len = float(args.rope["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{folder}: no *.safetensors weights. The reference runtime loads safetensors only; "
            "re-save the model with save_pretrained(safe_serialization=True) or build a reference engine."
        )
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(load_file(str(path)))
    return state


def _t(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [in, out] contiguous: x @ W^T as a plain matmul is faster than F.linear for a few rows."""
    return weight.t().contiguous()


def _cat_or_none(*parts: torch.Tensor | None) -> torch.Tensor | None:
    return torch.cat(parts) if all(p is not None for p in parts) else None  # type: ignore[arg-type]


def _linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # x: [row_block, in]; weight_t: [in, out]
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def _shape(weight: torch.Tensor) -> str:
    return "x".join(map(str, weight.shape))


def _attention_groups(start: int, n: int, block: int) -> list[tuple[int, int, int]]:
    """(first row, rows, keys) of consecutive query rows attended together: at most `block` rows, all
    in one key bucket, so a query's call has the same shape whatever rows it is computed with."""
    groups, i = [], 0
    while i < n:
        end = key_bucket_end(start + i)
        g = min(block, n - i, end - (start + i))
        groups.append((i, g, end))
        i += g
    return groups


class LlamaModel:
    """Weights plus a batched forward over rows of several sequences, each with its own KV cache."""

    def __init__(
        self,
        args: LlamaArgs,
        state: dict[str, torch.Tensor],
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        row_block: int | None = None,
        probe: bool = True,
        max_len: int | None = None,
    ):
        """row_block None: the first of the device's candidates that passes the probe on this machine, else
        1 (reference/exactness.py); N: N if it passes the probe, else SpecError. probe=False takes row_block (or
        the device's first candidate) unchecked: for tests of the probe and for baselines that need no
        invariance. max_len: the longest sequence the attention probe covers (default: the config's)."""
        from specbuild.reference.exactness import default_candidates

        self.args, self.device, self.dtype = args, torch.device(device), dtype
        self.row_block = row_block or default_candidates(self.device.type)[0]
        self.wide_blocks: tuple[int, ...] = ()  # rows per call for long runs (prefill), set by the probe when exact
        self.exactness = None  # the probe's RowBlockChoice, None when unprobed

        used: set[str] = set()

        def get(name: str) -> torch.Tensor:
            used.add(name)
            if name not in state:
                raise CheckpointError(
                    f"weight {name!r} is missing from the checkpoint: it is not a complete Llama model."
                )
            return state[name].to(device=self.device, dtype=dtype).contiguous()

        def maybe(name: str) -> torch.Tensor | None:
            return get(name) if name in state else None

        self.embed = get("model.embed_tokens.weight")  # [vocab, hidden]
        if self.embed.shape != (args.vocab_size, args.hidden_size):
            raise CheckpointError(
                f"model.embed_tokens.weight has shape {tuple(self.embed.shape)}, config.json says "
                f"[{args.vocab_size}, {args.hidden_size}]: the weights and config.json disagree."
            )
        self.layers = []
        for i in range(args.num_layers):
            p = f"model.layers.{i}."
            if p + "self_attn.qkv_proj.weight" in state:  # fused [q; k; v] (Phi-3)
                qkv, qkv_bias = get(p + "self_attn.qkv_proj.weight"), maybe(p + "self_attn.qkv_proj.bias")
            else:
                qkv = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
                qkv_bias = _cat_or_none(*(maybe(p + f"self_attn.{n}_proj.bias") for n in "qkv"))
            if p + "mlp.gate_up_proj.weight" in state:  # fused [gate; up] (Phi-3)
                gate_up, gate_up_bias = get(p + "mlp.gate_up_proj.weight"), maybe(p + "mlp.gate_up_proj.bias")
            else:
                gate_up = torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
                gate_up_bias = _cat_or_none(maybe(p + "mlp.gate_proj.bias"), maybe(p + "mlp.up_proj.bias"))
            self.layers.append(
                {
                    "attn_norm": get(p + "input_layernorm.weight"),
                    "qkv": _t(qkv),  # [hidden, (heads + 2 kv_heads) * head_dim]
                    "qkv_bias": qkv_bias,
                    "q_norm": get(p + "self_attn.q_norm.weight") if args.qk_norm else None,  # [head_dim]
                    "k_norm": get(p + "self_attn.k_norm.weight") if args.qk_norm else None,
                    "o": _t(get(p + "self_attn.o_proj.weight")),  # [heads * head_dim, hidden]
                    "o_bias": maybe(p + "self_attn.o_proj.bias"),  # attention_bias = true
                    # Llama: post_attention_layernorm is the MLP's input norm; Gemma 2 names that one pre_feedforward and
                    # normalizes the attention output with post_attention_layernorm and the MLP's with post_feedforward
                    "mlp_norm": get(
                        p
                        + (
                            "pre_feedforward_layernorm.weight"
                            if args.sandwich_norms
                            else "post_attention_layernorm.weight"
                        )
                    ),
                    "attn_out_norm": get(p + "post_attention_layernorm.weight") if args.sandwich_norms else None,
                    "mlp_out_norm": get(p + "post_feedforward_layernorm.weight") if args.sandwich_norms else None,
                    "gate_up": _t(gate_up),  # [hidden, 2 intermediate]
                    "gate_up_bias": gate_up_bias,
                    "down": _t(get(p + "mlp.down_proj.weight")),  # [intermediate, hidden]
                    "down_bias": maybe(p + "mlp.down_proj.bias"),  # mlp_bias = true
                }
            )
        self.norm = get("model.norm.weight")
        lm_head = maybe("lm_head.weight")
        self.lm_head = _t(self.embed if args.tie_word_embeddings or lm_head is None else lm_head)  # [hidden, vocab]
        unknown = sorted(k for k in state if k not in used and not k.endswith("rotary_emb.inv_freq"))
        if unknown:
            raise CheckpointError(
                f"the checkpoint has weights a plain Llama does not use ({', '.join(unknown[:4])}"
                f"{', ...' if len(unknown) > 4 else ''}): the reference runtime would ignore them and compute "
                "something else. Check the architecture in config.json."
            )
        self.parameter_count = sum(state[name].numel() for name in used)  # the weights a step reads
        self.inv_freq = rope_inv_freq(args).to(self.device)  # [head_dim // 2], float32
        self._cos = self._sin = torch.empty(0, args.head_dim, device=self.device, dtype=dtype)
        self.max_len = max_len or args.max_position_embeddings
        if probe:
            from specbuild.reference.exactness import settle

            settle(self, requested=row_block)

    @classmethod
    def from_folder(
        cls,
        folder: str | Path,
        device: str = "cpu",
        row_block: int | None = None,
        probe: bool = True,
        max_len: int | None = None,
    ) -> LlamaModel:
        folder = Path(folder)
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise CheckpointError(
                f"{folder} has no config.json: point at a Hugging Face model folder or a reference engine."
            )
        try:
            config = json.loads(config_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{config_path} is unreadable ({err}). Re-save the model.") from None
        return cls(
            args_from_config(config, str(folder)),
            _load_state_dict(folder),
            device=device,
            row_block=row_block,
            probe=probe,
            max_len=max_len,
        )

    def new_cache(self) -> SequenceKV:
        a = self.args
        return SequenceKV(a.num_layers, a.num_kv_heads, a.head_dim, self.device, self.dtype)

    # -- the parts forward runs on fixed-size blocks of rows (the probe runs the same ones) -------

    def row_parts(self) -> list[tuple[str, Callable[..., torch.Tensor], list[int]]]:
        """(name, fn, width of each input) of each function forward applies to [row_block, width] blocks."""
        return [*self.layer_parts(), (f"lm_head {_shape(self.lm_head)}", self._logits, [self.args.hidden_size])]

    def layer_parts(self) -> list[tuple[str, Callable[..., torch.Tensor], list[int]]]:
        """The row parts of a layer: the ones forward also runs in wide calls (`wide_blocks`) for long runs.
        Layer 0's stand for every layer's: all layers have the same shapes (and biases or none)."""
        a, layer = self.args, self.layers[0]
        return [
            (f"qkv {_shape(layer['qkv'])}", lambda x: self._qkv(layer, x), [a.hidden_size]),
            (
                f"o {_shape(layer['o'])} + mlp {_shape(layer['gate_up'])}, {_shape(layer['down'])}",
                lambda x, attn: self._post_attention(layer, x, attn),
                [a.hidden_size, a.num_heads * a.head_dim],
            ),
        ]

    def _qkv(self, layer: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        # x: [row_block, hidden] -> [row_block, (heads + 2 kv_heads) * head_dim]
        qkv = _linear(self._rms_norm(x, layer["attn_norm"]), layer["qkv"], layer["qkv_bias"])
        if layer["q_norm"] is None:
            return qkv
        a = self.args  # each head's q and k normalized over head_dim (Qwen3), before rope
        nq, nkv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        q = self._rms_norm(qkv[:, :nq].reshape(-1, a.num_heads, a.head_dim), layer["q_norm"]).reshape(-1, nq)
        k = self._rms_norm(qkv[:, nq : nq + nkv].reshape(-1, a.num_kv_heads, a.head_dim), layer["k_norm"])
        return torch.cat([q, k.reshape(-1, nkv), qkv[:, nq + nkv :]], dim=-1)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:  # h: [row_block, hidden] -> [row_block, vocab]
        logits = _linear(self._rms_norm(h, self.norm), self.lm_head)
        cap = self.args.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def attend(
        self, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """queries: [1, heads, row_block, head_dim]; keys, values: [1, kv_heads, end, head_dim]; mask: [row_block, end]."""
        a = self.args
        scale = a.head_dim**-0.5 if a.query_scale is None else a.query_scale
        if a.attn_softcap is None:
            return F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
            )  # [1, heads, row_block, head_dim]
        groups = a.num_heads // a.num_kv_heads  # soft-capped scores: the computation written out, as transformers'
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        scores = torch.matmul(queries, keys.transpose(2, 3)) * scale  # [1, heads, row_block, end]
        scores = torch.tanh(scores / a.attn_softcap) * a.attn_softcap + mask
        return torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(queries.dtype), values)

    def _rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [>= n, head_dim]. Grown in fixed chunks of positions, each computed once with the
        same shape, so a position's values never depend on how long the table was when it was made."""
        chunk = 1024
        while self._cos.shape[0] < n:
            start = self._cos.shape[0]
            positions = torch.arange(start, start + chunk, device=self.device, dtype=torch.float32)
            freqs = positions[:, None] * self.inv_freq[None, :]  # [chunk, head_dim // 2]
            emb = torch.cat((freqs, freqs), dim=-1)  # as transformers' LlamaRotaryEmbedding
            self._cos = torch.cat([self._cos, emb.cos().to(self.dtype)])
            self._sin = torch.cat([self._sin, emb.sin().to(self.dtype)])
        return self._cos, self._sin

    def causal_mask(self, first: int, end: int, block: int, window: int | None = None) -> torch.Tensor:
        """[block, end] additive mask: query row r (position first + r) sees the keys at positions
        <= its own (0), not the later ones (-inf), and with a sliding window only the last `window`
        of them (as transformers' sliding-window mask: q - k < window). Every row sees its own key."""
        positions = first + torch.arange(block, device=self.device)
        keys = torch.arange(end, device=self.device)[None, :]
        hidden = keys > positions[:, None]
        if window is not None:
            hidden |= positions[:, None] - keys >= window
        return torch.zeros(hidden.shape, device=self.device, dtype=self.dtype).masked_fill_(hidden, float("-inf"))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # x: [..., width]
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.args.rms_norm_eps)
        if self.args.norm_offset:  # Gemma: (1 + weight), in float32 (transformers' GemmaRMSNorm)
            return (h * (1.0 + weight.float())).to(x.dtype)
        return weight * h.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [rows, heads, head_dim]; cos, sin: [rows, 1, head_dim]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, batch: list[tuple[SequenceKV, list[int]]], want: list[int]) -> list[torch.Tensor]:
        """Append tokens to each sequence's cache and return logits for the last want[i] of them.

        batch: (cache, new tokens) per sequence; the new tokens sit at positions cache.length...
        Returns one float32 tensor [want[i], vocab] per sequence.
        """
        if self.exactness is not None and self.exactness.threads not in (None, torch.get_num_threads()):
            from specbuild.reference.exactness import reprobe_for_threads

            reprobe_for_threads(self)  # the BLAS code path can depend on the thread count
        a, block = self.args, self.row_block
        ids, pos, spans = [], [], []
        for cache, tokens in batch:
            start = cache.length
            spans.append((len(ids), start, len(tokens)))
            ids.extend(tokens)
            pos.extend(range(start, start + len(tokens)))
            cache.reserve(start + len(tokens))
        rows = len(ids)
        padded = -(-rows // block) * block
        ids_t = torch.tensor(ids + [0] * (padded - rows), device=self.device)
        pos_t = torch.tensor(pos + [0] * (padded - rows), device=self.device)
        cos, sin = self._rope_tables(max(pos) + 1 if pos else 1)
        cos, sin = cos[pos_t][:, None, :], sin[pos_t][:, None, :]  # [padded, 1, head_dim]

        x = self.embed[ids_t]  # [padded, hidden]
        if a.embed_scale:  # Gemma: times sqrt(hidden), rounded to the model's dtype first, as transformers does
            x = x * torch.tensor(a.hidden_size**0.5, dtype=self.dtype)
        nq, nkv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        pad = torch.zeros(padded - rows, nq, device=self.device, dtype=self.dtype)
        groups = {
            window: [
                [
                    (i, g, end, self.causal_mask(start + i, end, block, window))
                    for i, g, end in _attention_groups(start, n, block)
                ]
                for _, start, n in spans
            ]
            for window in set(a.windows) | {None}
        }  # one mask per group and per window the layers use
        extend = bool(spans) and spans[-1][0] + spans[-1][2] - 1 + block > padded
        for li, layer in enumerate(self.layers):
            qkv = run_blocks(lambda b: self._qkv(layer, b), [x], block, self.wide_blocks)  # noqa: B023 (called within this iteration)
            q = self._rope(qkv[:, :nq].view(padded, a.num_heads, a.head_dim), cos, sin)
            k = self._rope(qkv[:, nq : nq + nkv].view(padded, a.num_kv_heads, a.head_dim), cos, sin)
            v = qkv[:, nq + nkv :].view(padded, a.num_kv_heads, a.head_dim)
            if extend:  # a full block of query rows must exist from every group's first row
                q = torch.cat([q, q.new_zeros(block, a.num_heads, a.head_dim)])
            queries = q.transpose(0, 1).unsqueeze(0)  # [1, heads, rows, head_dim]
            outs = []
            for (cache, _), (row0, start, n), seq_groups in zip(
                batch, spans, groups[a.windows[li] if a.windows else None]
            ):
                cache.k[li][start : start + n] = k[row0 : row0 + n]
                cache.v[li][start : start + n] = v[row0 : row0 + n]
                keys = cache.k[li].transpose(0, 1).unsqueeze(0)  # [1, kv_heads, capacity, head_dim]
                values = cache.v[li].transpose(0, 1).unsqueeze(0)
                for i, g, end, mask in seq_groups:  # rows past the group's g are others' or padding: dropped
                    out = self.attend(
                        queries[:, :, row0 + i : row0 + i + block], keys[:, :, :end], values[:, :, :end], mask
                    )
                    outs.append(out[0, :, :g])
            attn = (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]).transpose(0, 1).reshape(rows, nq)
            if padded > rows:
                attn = torch.cat([attn, pad])  # [padded, heads * head_dim]
            x = run_blocks(lambda xb, ab: self._post_attention(layer, xb, ab), [x, attn], block, self.wide_blocks)  # noqa: B023 (called within this iteration)
        for cache, tokens in batch:
            cache.commit(tokens)

        picks = [row0 + n - w + j for (row0, _, n), w in zip(spans, want) for j in range(w)]
        if not picks:
            return [torch.empty(0, a.vocab_size) for _ in batch]
        h = x[torch.tensor(picks, device=self.device)]
        h = torch.cat([h, h.new_zeros(-(-len(picks) // block) * block - len(picks), a.hidden_size)])
        logits = run_blocks(self._logits, [h], block).float().cpu()
        out, at = [], 0
        for w in want:
            out.append(logits[at : at + w])
            at += w
        return out

    def _post_attention(self, layer: dict[str, torch.Tensor], x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        # x: [row_block, hidden] the residual stream; attn: [row_block, heads * head_dim]
        out = _linear(attn, layer["o"], layer["o_bias"])
        x = x + (out if layer["attn_out_norm"] is None else self._rms_norm(out, layer["attn_out_norm"]))
        gate, up = _linear(self._rms_norm(x, layer["mlp_norm"]), layer["gate_up"], layer["gate_up_bias"]).chunk(
            2, dim=-1
        )
        act = F.silu(gate) if self.args.activation == "silu" else F.gelu(gate, approximate="tanh")
        out = _linear(act * up, layer["down"], layer["down_bias"])
        return x + (out if layer["mlp_out_norm"] is None else self._rms_norm(out, layer["mlp_out_norm"]))
