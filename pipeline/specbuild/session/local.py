"""In-process generation: one loaded target/draft pair (or a target alone), many requests (`specbuild generate
--local`, bench).

    session = LocalSession.from_spec(spec)              # loads both models and the tokenizer
    gen = session.generate("def f(x):", Options(max_tokens=32), on_text=print)
    gen.to_dict()                                       # the `generate --local --json` document

The pair runs on the reference runtime (`reference.loading.load_pair`: reference engines when built,
else the Hugging Face checkpoints), behind the same Drafter/Verifier adapters as the Triton BLS.

The schedule: `overlap` is the session's default (the spec's speculative.overlap, "auto" resolved for this
machine by `reference.loading.resolve_overlap`), `Options.overlap` a request's own. When the session drafts
ahead, its early drafts come from a second copy of the draft model in a child process
(`reference.draftproc`); a request that drafts ahead on a session loaded without one runs the early drafts
on a thread (`speculative.overlap.ThreadedAhead`: the same text, but two threads of one process mostly
wait for each other's GIL). Call `close()` when done (it stops the child process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from specbuild import drafters
from specbuild.config import Spec
from specbuild.decode.drafting import Drafting
from specbuild.decode.driver import drive
from specbuild.decode.generation import Generation, Options
from specbuild.decode.grammar import GuideRequest
from specbuild.decode.request import RequestRules
from specbuild.decode.textstream import TextStream
from specbuild.drafters import LookupSettings
from specbuild.errors import RequestError
from specbuild.hfmodel import end_ids
from specbuild.speculative.interfaces import Drafter, SamplingParams, Verifier
from specbuild.speculative.overlap import AutoSchedule

__all__ = ["LocalSession"]


class LocalSession:
    """A Drafter/Verifier pair in this process and how to tokenize for it; many requests, one at a time or from
    several threads (each with its own `pair`, e.g. batched)."""

    def __init__(
        self,
        drafter: Drafter | None,
        verifier: Verifier,
        encode: Callable[[str], list[int]],
        *,
        tokenizer: Any = None,
        end_id: int | None = None,
        other_end_ids: tuple[int | None, ...] = (),
        default_k: int = 4,
        adaptive: bool = False,
        max_seq_len: int | None = None,
        pair: Any = None,
        overlap: bool | str = False,
        overlap_reason: str | None = None,
        ahead_drafter: Drafter | None = None,
        sources: dict[str, Any] | None = None,
        drafting: Drafting | None = None,
        vocab_size: int | None = None,
    ):
        self.drafter, self.verifier = drafter, verifier
        # the drafters requests can choose: the draft model's (`drafter`; None: there is none), prompt lookup, the
        # hybrid
        self.drafting = drafting or Drafting.create(drafters.MODEL, drafter, LookupSettings())
        self._encode = encode  # prompt text -> token ids
        self.tokenizer = tokenizer  # detokenizes streamed text (None: token ids only)
        # K, the end ids (end_id, then the others that end a request as it does) and the stop words, per request
        self.rules = RequestRules(
            tokenizer,
            end_ids(end_id, other_end_ids),
            verifier.max_draft_len,
            default_k,
            adaptive,
            self.drafting.default,
            self.drafting.available,
            vocab_size=vocab_size,  # guided requests: the tokenizer's vocabulary and the model's size
        )
        self.max_seq_len = max_seq_len  # prompt + generated tokens the engines take (None: no limit known)
        self.pair = pair  # reference.loading.LocalPair when loaded from a spec
        self.overlap = overlap  # the schedule when a request does not say: False, True or "auto"
        self.overlap_reason = overlap_reason or f"overlap {overlap}"  # why (how "auto" was resolved here)
        self.ahead_drafter = ahead_drafter  # the drafter of requests that draft ahead (None: `drafter`)
        self._lock = threading.Lock()  # fast tokenizers are not safe to call from several threads at once
        self.auto_schedule = AutoSchedule()  # overlap = "auto": measured across this session's requests
        self.sources = sources or {}  # which weights run, when not a `pair` (e.g. the LLM API path's export)

    @classmethod
    def from_spec(
        cls,
        spec: Spec,
        device: str | None = None,
        use_cache: bool = True,
        threads: int | None = None,
        row_block: int | None = None,
        overlap: bool | str | None = None,
    ) -> LocalSession:
        """The spec's pair on the reference runtime (row_block: see reference.loading.load_contract_model); the spec
        gives the default K, whether K adapts, and the schedule (`overlap`: None = the spec's
        speculative.overlap)."""
        from transformers import AutoTokenizer

        from specbuild.reference.loading import load_pair

        pair = load_pair(
            spec,
            device=None if device == "auto" else device,
            use_cache=use_cache,
            threads=threads,
            row_block=row_block,
            overlap=spec.speculative.overlap if overlap is None else overlap,
        )
        tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
        limit = pair.target_model.limits.max_seq_len - pair.max_draft_len
        if pair.draft_model is not None:
            limit = min(pair.draft_model.limits.max_seq_len, limit)
        return cls(
            pair.drafter,
            pair.verifier,
            lambda text: tokenizer(text)["input_ids"],
            tokenizer=tokenizer,
            end_id=pair.end_id,
            other_end_ids=(*pair.other_end_ids, tokenizer.eos_token_id),
            default_k=spec.speculative.num_draft_tokens,
            adaptive=spec.speculative.adaptive,
            max_seq_len=limit,
            pair=pair,
            overlap=pair.overlap,
            overlap_reason=pair.overlap_reason,
            ahead_drafter=pair.ahead_drafter,
            drafting=Drafting.create(spec.speculative.drafter, pair.drafter, spec.lookup),
            vocab_size=pair.target_model.engine.vocab_size,
        )

    def close(self) -> None:
        """Stop the draft model's child process, if this session started one."""
        if self.pair is not None:
            self.pair.close()
        self.ahead_drafter = None

    def __enter__(self) -> LocalSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def max_draft_len(self) -> int:
        return self.verifier.max_draft_len

    @property
    def end_id(self) -> int | None:
        """The end id the models get (None: the pair has none)."""
        return self.rules.end_ids[0] if self.rules.end_ids else None

    @property
    def default_k(self) -> int:
        return self.rules.default_k

    def encode(self, text: str) -> list[int]:
        with self._lock:
            return [int(t) for t in self._encode(text)]

    def describe(self) -> dict[str, Any]:
        """Which weights run and how exact the runtime is on this machine (the --json document's fields)."""
        if self.pair is None:
            return dict(self.sources)
        pair = self.pair
        return {
            "engine_source": pair.target.kind,
            "draft_engine_source": pair.draft.kind if pair.draft is not None else None,
            "row_block": pair.target_model.engine.model.row_block,
            "exactness": {
                role: m.engine.model.exactness.as_dict()
                for role, m in (("target", pair.target_model), ("draft", pair.draft_model))
                if m is not None
            },
        }

    def generate(
        self,
        prompt: str | list[int],
        options: Options,
        on_text: Callable[[str], None] | None = None,
        pair: tuple[Drafter, Verifier] | None = None,
        text: bool = True,
    ) -> Generation:
        """One request. `pair`: another Drafter/Verifier over the same models (e.g. batched for concurrent
        callers); `text`: False skips detokenizing (the benchmark)."""
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if self.max_seq_len is not None and len(prompt_ids) + options.max_tokens > self.max_seq_len:
            raise RequestError(
                f"the prompt ({len(prompt_ids)} tokens) + max_tokens {options.max_tokens} = "
                f"{len(prompt_ids) + options.max_tokens} tokens exceeds the engines' max_seq_len = {self.max_seq_len}: "
                "ask for fewer tokens or shorten the prompt (or raise build.max_seq_len and rebuild)."
            )
        with self._lock:  # the stop words are tokenized too
            ready = self.rules.prepare(
                max_tokens=options.max_tokens,
                sampling=SamplingParams(options.temperature, options.top_k, options.top_p, options.seed),
                num_draft_tokens=options.num_draft_tokens,
                stop=options.stop,
                adaptive=options.adaptive,
                overlap=self.overlap if options.overlap is None else options.overlap,
                drafter=options.drafter,
                guide=GuideRequest.from_inputs(options.guide_type, options.guide),
            )
        overlap = ready.request.overlap  # off for lookup alone (decode.request)
        # Drafting ahead, the early drafts come from the draft model's own process; "auto" makes a step's own
        # drafts in this process (no round trip to the other) and sequential segments are the sequential schedule.
        ahead = self.ahead_drafter if overlap and self.ahead_drafter else None
        model, verifier = pair or (self.drafter if overlap == "auto" or ahead is None else ahead, self.verifier)
        drafter = self.drafting.drafter(ready.drafter, model)
        stream = TextStream(self.tokenizer, prompt_ids) if text and self.tokenizer is not None else None
        generation = drive(
            prompt_ids,
            drafter,
            verifier,
            ready.request,
            k=ready.k,
            text=stream,
            on_text=on_text,
            stop_words=ready.stop_words,
            schedule=self.auto_schedule,
            ahead_drafter=ahead if pair is None else None,
            drafter_name=ready.drafter,
            guide=ready.guide,
        )
        if generation.finish_reason != "cancelled":
            self.drafting.remember(ready.drafter, prompt_ids, generation.output_ids or [], generation.stats)
        generation.extra = {
            **self.describe(),
            "overlap_reason": self._overlap_reason(options, ready.drafter, overlap),
            "sampling": options.sampling_dict(),
            **({"lookup_pool": self.drafting.figures()} if self.drafting.pool is not None else {}),
        }
        return generation

    def _overlap_reason(self, options: Options, drafter: str, overlap: bool | str) -> str:
        if not drafters.get(drafter).needs_draft_model:
            return f"overlap off: drafter {drafter} (decode.request)"
        return self.overlap_reason if options.overlap is None else f"overlap {overlap} as asked"
