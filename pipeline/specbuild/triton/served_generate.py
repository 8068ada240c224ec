"""`specbuild generate` through a running server: the same --json document as `generate --local`.

The finish reason is not a BLS output; it is inferred: `length` when max_tokens tokens came back,
else `eos_or_stop` (the server stopped early on EOS or a stop word). Triton's llmapi model (the LLM API
path) sends its own finish_reason and no token ids (`specbuild.llmapi.client` counts the tokens).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from specbuild.config import Spec
from specbuild.speculative.stats import SpeculationStats


def default_url(spec: Spec, protocol: str) -> str:
    host = "127.0.0.1" if spec.serve.host in ("0.0.0.0", "::") else spec.serve.host
    return f"{host}:{spec.serve.grpc_port if protocol == 'grpc' else spec.serve.http_port}"


def generate(spec: Spec, prompt: str, *, url: str | None, protocol: str, on_text: Callable[[str], None] | None,
             max_tokens: int, num_draft_tokens: int | None, temperature: float, top_k: int, top_p: float,
             seed: int | None, adaptive: bool | None = None) -> dict[str, Any]:
    from specbuild.triton.client import SpecbuildClient

    url = url or default_url(spec, protocol)
    k = spec.speculative.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
    parts: list[str] = []
    final: dict[str, Any] = {}
    started = time.perf_counter()
    first_token = None
    with SpecbuildClient(url, protocol=protocol, count_tokens=_lazy_counter(spec)) as client:
        for chunk in client.generate(prompt, max_tokens=max_tokens, num_draft_tokens=k, temperature=temperature,
                                     top_k=top_k, top_p=top_p, seed=seed, stream=on_text is not None):
            if chunk.text:
                first_token = first_token if first_token is not None else time.perf_counter() - started
                parts.append(chunk.text)
                if on_text is not None:
                    on_text(chunk.text)
            if chunk.stats:
                final = chunk.stats
    seconds = time.perf_counter() - started
    stats = SpeculationStats.from_dict(final["speculation_stats"]) if "speculation_stats" in final else SpeculationStats()
    output = list(final.get("output_ids", []))
    count = int(final.get("num_output_tokens", len(output)))
    return {
        "text": "".join(parts),
        "output_ids": output,
        "num_output_tokens": count,
        "finish_reason": final.get("finish_reason") or ("length" if count >= max_tokens else "eos_or_stop"),
        "num_draft_tokens": k,
        "adaptive": None,  # the deployment decides (tensorrt_llm_bls parameter adaptive_draft_len)
        **stats.report_fields(),
        "tokens_per_s": count / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
        "time_to_first_token_s": first_token,
        "engine_source": None,
        "server": {"url": url, "protocol": protocol},
        "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed},
    }


def _lazy_counter(spec: Spec) -> Callable[[str], int]:
    """Tokens in a text, with the target's tokenizer loaded on first use (only the llmapi client asks)."""
    counter: list[Callable[[str], int]] = []

    def count(text: str) -> int:
        if not counter:
            from specbuild.llmapi.checkpoint import checkpoint_dir
            from specbuild.llmapi.up import token_counter

            folder = checkpoint_dir(spec, "target")
            counter.append(token_counter(folder if (folder / "tokenizer_config.json").is_file() else spec.target.checkpoint))
        return counter[0](text)

    return count
