"""One request assembled once, for every path that runs the loop in-process.

    rules = RequestRules(tokenizer, end_ids=(2, 32000), max_draft_len=8, default_k=4)
    ready = rules.prepare(max_tokens=64, sampling=SamplingParams(), stop=["\\n\\n"])
    drive(prompt_ids, drafter, verifier, ready.request, k=ready.k, stop_words=ready.stop_words)

The Triton BLS (`triton.models.bls`), the local session (`session.local`) and the CPU stand-in for Triton's
llmapi model (`llmapi.llm`) each hold one `RequestRules`, made when they load, and call `prepare` per
request. What differs between them stays theirs: how a request arrives (tensors, `Options`, the LLM API's
sampling params), how the prompt is tokenized (the BLS by preprocessing's rules) and which length limit
refuses it, with which message.

The rules, each written here only:
- The drafter: the request's (`specbuild.drafters`), else the deployment's default; one the deployment cannot run
  (a draft model's, without one) is refused by name. Lookup alone runs sequentially: a lookup costs too little to
  hide, and the early drafts of the overlapped schedule come from a draft model (the hybrid's, for the hybrid).
- K: the one K rule (`speculative.draft_len.resolve_k`): the request's, else the deployment's default,
  clamped to max_draft_len; with K = 0 nothing adapts.
- End ids: a request that names none ends at any of the deployment's (`end_ids`, read once from the
  tokenizer and the checkpoint, `specbuild.hfmodel.end_ids`); one that names an id ends at that one only; -1
  is TensorRT-LLM's "no end id" (its range is [-1, vocab)), which the models get as sent.
- Stop words: each tokenized without special tokens, the sequences NVIDIA's preprocessing packs into
  TensorRT-LLM's [2, n] word list for the engines (`contract.words`); a word that tokenizes to nothing is
  dropped, as there. `stop_words` maps each sequence back to its text, for `stop_reason`.
- A guide (structured output: `decode.grammar`): compiled per request by the deployment's `Grammars`; a guided
  request ends at the deployment's end ids (the grammar's stop tokens), so one naming another end_id is refused.
- Stop token ids (the LLM API's `SamplingParams.stop_token_ids`): each a one-token stop sequence whose
  `stop_reason` is the id, matched before the words, as TensorRT-LLM's `_get_stop_reasons_and_words` lists
  them (tensorrt_llm/sampling_params.py @a98a906).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specbuild import drafters
from specbuild.decode.grammar import Grammars, GuideRequest, XgrammarGuide
from specbuild.errors import RequestError
from specbuild.speculative.draft_len import ResolvedK, resolve_k
from specbuild.speculative.interfaces import SamplingParams
from specbuild.speculative.loop import GenerationRequest

__all__ = ["NO_END_ID", "Prepared", "RequestRules"]

NO_END_ID = -1  # TensorRT-LLM's end_id for "never end on a token"


@dataclass(frozen=True)
class Prepared:
    request: GenerationRequest  # what the loop runs
    k: ResolvedK  # how K was chosen, reported with the response
    model_end_id: int | None  # the end_id the models get (NO_END_ID kept; None: the deployment has none)
    stop_words: dict[tuple[int, ...], str | int]  # stop sequence -> its text (a stop token id: the id)
    drafter: str = drafters.DEFAULT  # which drafter proposes (specbuild.drafters)
    guide: XgrammarGuide | None = None  # this request's grammar state (structured output), None: unguided


@dataclass(frozen=True)
class RequestRules:
    """What a deployment fixes for all its requests, read once when it loads."""

    tokenizer: Any  # anything with encode(text, add_special_tokens=): the stop words
    end_ids: tuple[int, ...]  # every id that ends a request naming none; the first is the models' end_id
    max_draft_len: int
    default_k: int  # K when a request asks for none
    adaptive: bool = False  # K adapts when a request does not say
    default_drafter: str = drafters.DEFAULT  # the drafter when a request names none
    runnable_drafters: tuple[str, ...] = (drafters.DEFAULT,)  # the drafters this deployment can run
    # the target's rows (its vocab_size): with the tokenizer, guided requests are served, their grammars compiled
    # against the tokenizer's vocabulary with this deployment's end ids as stop tokens; None: no guided request
    vocab_size: int | None = None
    grammars: Grammars | None = field(init=False, default=None, repr=False, compare=False)  # from the fields above

    def __post_init__(self) -> None:
        if self.tokenizer is not None and self.vocab_size:
            object.__setattr__(self, "grammars", Grammars(self.tokenizer, self.vocab_size, self.end_ids))

    def prepare(
        self,
        *,
        max_tokens: int,
        sampling: SamplingParams,
        num_draft_tokens: int | None = None,
        end_id: int | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        adaptive: bool | None = None,
        overlap: bool | str = False,
        drafter: str | None = None,
        guide: GuideRequest | None = None,
    ) -> Prepared:
        """One request's GenerationRequest. `end_id`: None = the deployment's; NO_END_ID = none. Values are
        kept as asked: the loop's `GenerationRequest.validate` refuses a bad one by name."""
        k = resolve_k(num_draft_tokens, self.max_draft_len, default=self.default_k)
        name = self.default_drafter if drafter is None else drafter
        if name not in self.runnable_drafters:
            known = name in drafters.NAMES
            raise RequestError(
                f"drafter = {name!r} "
                + ("cannot run here: this deployment has no draft model" if known else "is unknown")
                + f". Use one of: {', '.join(self.runnable_drafters)}."
            )
        if end_id is None:
            model_end_id = self.end_ids[0] if self.end_ids else None
            others = self.end_ids[1:]
        else:
            model_end_id, others = end_id, ()
        if any(stop) and self.tokenizer is None:
            raise RequestError("stop words need a tokenizer, and this deployment has none (token ids only).")
        encoded = {tuple(self.tokenizer.encode(word, add_special_tokens=False)): word for word in stop if word}
        stop_words: dict[tuple[int, ...], str | int] = {(int(i),): int(i) for i in stop_token_ids}
        stop_words.update((ids, word) for ids, word in encoded.items() if ids and ids not in stop_words)
        request = GenerationRequest(
            max_tokens=max_tokens,
            num_draft_tokens=k.k,
            sampling=sampling,
            end_id=None if model_end_id == NO_END_ID else model_end_id,
            other_end_ids=others,
            stop_sequences=[list(ids) for ids in stop_words],
            adaptive=(self.adaptive if adaptive is None else adaptive) and k.k > 0,
            overlap=overlap if drafters.get(name).needs_draft_model else False,
        )
        grammar = None
        if guide is not None:
            if self.grammars is None:
                raise RequestError(
                    "this deployment does not serve guided requests: structured output runs on the engine path (the "
                    "BLS, and `generate --local` on the reference runtime), which needs the tokenizer."
                )
            if model_end_id not in self.end_ids:
                raise RequestError(
                    f"end_id = {model_end_id} cannot end a guided request: a guided output ends where its grammar "
                    f"allows, at one of the deployment's end ids {list(self.end_ids)}; leave end_id unset."
                )
            grammar = self.grammars.guide(guide)
        return Prepared(request, k, model_end_id, stop_words, name, grammar)
