"""The peer to beat: the same pair through Hugging Face `generate(assistant_model=...)`.

Same checkpoints, prompts, K and greedy decoding as the local run, measured in the same run
(requests interleaved with ours). K = 0 is plain `generate`. The assistant drafts exactly K tokens
per step: schedule "constant" and no confidence early-stop (HF's defaults adapt K instead).
Hugging Face does not report acceptance, so only times and token counts are recorded.
"""

from __future__ import annotations

import time
from pathlib import Path

from specbuild.bench.runner import Settings
from specbuild.bench.stats import RequestResult, top_token_share
from specbuild.bench.workloads import Prompt
from specbuild.config import Spec
from specbuild.errors import BenchError, CheckpointError


class _FirstTokenClock:
    """A generate() streamer that notes when the first generated token arrives (the first put is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class HFPeer:
    name = "hf"
    concurrent = False
    max_draft_len = None

    def __init__(self, target_dir: Path, draft_dir: Path, end_id: int | None = None, tokenizer_dir: Path | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or target_dir), local_files_only=True)
            self.target = AutoModelForCausalLM.from_pretrained(
                str(target_dir), dtype=torch.float32, local_files_only=True
            ).eval()
            self.draft = AutoModelForCausalLM.from_pretrained(
                str(draft_dir), dtype=torch.float32, local_files_only=True
            ).eval()
        except (OSError, ValueError) as err:
            raise CheckpointError(
                f"--vs-hf: cannot load the pair with transformers ({err}). "
                "The spec's checkpoints must be Hugging Face model folders."
            ) from None
        self.end_id = end_id if end_id is not None else self.tokenizer.eos_token_id
        gc = self.draft.generation_config
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0

    @classmethod
    def from_spec(cls, spec: Spec, end_id: int | None = None) -> HFPeer:
        if spec.draft is None:
            raise BenchError(
                "--vs-hf compares with transformers' assisted generation, which needs a draft model, and the spec has "
                "no [draft]. Drop --vs-hf."
            )
        for role in ("target", "draft"):
            if not (Path(spec.role(role).checkpoint) / "config.json").is_file():
                raise BenchError(
                    f"--vs-hf needs the {role}'s Hugging Face folder, but {spec.role(role).checkpoint} "
                    "has no config.json. Point the spec at the HF checkpoints."
                )
        return cls(spec.target.checkpoint, spec.draft.checkpoint, end_id=end_id)

    def request(
        self, prompt: Prompt, k: int, max_tokens: int, settings: Settings, concurrent: bool = False
    ) -> RequestResult:
        if settings.temperature > 0:
            raise BenchError("--vs-hf compares greedy decoding only: drop --temperature or set it to 0.")
        torch = self.torch
        start = time.perf_counter()
        ids = self.tokenizer(prompt.text, return_tensors="pt").input_ids  # [1, prompt_len], as `generate --local`
        clock = _FirstTokenClock()
        kwargs = {
            "max_new_tokens": max_tokens,
            "do_sample": False,
            "streamer": clock,
            "eos_token_id": self.end_id,
            "pad_token_id": self.end_id,
        }
        if k > 0:
            self.draft.generation_config.num_assistant_tokens = k
            kwargs["assistant_model"] = self.draft
        with torch.inference_mode():
            out = self.target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)  # [1, prompt_len + n]
        seconds = time.perf_counter() - start
        generated = out[0, ids.shape[1] :].tolist()
        if self.end_id in generated:
            generated = generated[: generated.index(self.end_id)]
        return RequestResult(
            prompt_index=0,
            num_draft_tokens=k,
            output_tokens=len(generated),
            seconds=seconds,
            ttft_seconds=(clock.first - start) if clock.first else seconds,
            top_token_share=top_token_share(generated),
        )
