"""`specbuild generate` through a running server: the same --json document as `generate --local`.

The finish reason is not a BLS output; it is inferred: `length` when max_tokens tokens came back,
else `eos_or_stop` (the server stopped early on EOS or a stop word).
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
    with SpecbuildClient(url, protocol=protocol) as client:
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
    return {
        "text": "".join(parts),
        "output_ids": output,
        "num_output_tokens": len(output),
        "finish_reason": "length" if len(output) >= max_tokens else "eos_or_stop",
        "num_draft_tokens": k,
        "adaptive": None,  # the deployment decides (tensorrt_llm_bls parameter adaptive_draft_len)
        **stats.report_fields(),
        "tokens_per_s": len(output) / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
        "time_to_first_token_s": first_token,
        "engine_source": None,
        "server": {"url": url, "protocol": protocol},
        "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed},
    }
