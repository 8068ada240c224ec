"""`generate --local` on the LLM API path: the weights the llmapi server loads, run as its CPU stand-in runs them.

The server loads `convert --backend llmapi`'s export (<output_dir>/<pair>/<role>/hf_checkpoint: the weights rounded
to float16 or bfloat16, or FP8), not the original checkpoint; run on the original float32 weights, a local
generation can give another text than the server's. `local_pair` loads the export with the stand-in's own loader
(`llmapi.llm.StandInLLM`: the LLM arguments `build --backend llmapi` writes, the release's architecture and
sliding-window rules) and ends a request where the LLM API does: at the tokenizer's eos, and at the checkpoint's
other end ids, which every served request carries as stop_token_ids (`llmapi.end_ids`). Its output_ids are the
models' own, which Triton's llmapi model does not send. `paths.llmapi_path` runs it as a
`session.local.LocalSession` (this package sits above the session and does not import it).
"""

from __future__ import annotations

from specbuild.config import Spec
from specbuild.errors import ArtifactError
from specbuild.llmapi import args as args_mod
from specbuild.llmapi.checkpoint import checkpoint_dir

SOURCE = "llmapi-export"  # `engine_source` in the generate document: the LLM API path's export


def local_pair(spec: Spec, device: str | None = "cpu") -> dict:
    """The spec's pair as the llmapi server runs it, in this process, as `session.local.LocalSession`'s arguments
    (ArtifactError before `convert --backend llmapi`); device: cpu, cuda, or auto/None (cuda when torch sees one)."""
    from specbuild.contract.adapters import ContractDrafter, ContractVerifier
    from specbuild.hfmodel import listed_end_ids
    from specbuild.llmapi.llm import NoDraft, StandInLLM
    from specbuild.reference.loading import resolve_device

    folders = {role: checkpoint_dir(spec, role) for role in spec.roles}
    for role, folder in folders.items():
        if not (folder / "config.json").is_file():
            raise ArtifactError(
                f"no LLM API checkpoint for the {role} at {folder}: run `specbuild convert --backend "
                "llmapi` first (the llmapi server and this local run load that export)."
            )
    engine_args = args_mod.llm_args(spec, args_mod.locations(spec, folders.__getitem__))
    llm = StandInLLM(engine_args, device=resolve_device(device))
    eos = llm.tokenizer.eos_token_id
    # the LLM ends at the tokenizer's eos, and every served request carries the checkpoint's listed end ids as
    # stop_token_ids (llmapi.end_ids.stop_token_ids: none without an eos); the session ends at each once
    verifier = ContractVerifier(llm.target, max_draft_len=llm.k, end_id=eos)
    drafter = ContractDrafter(llm.draft, end_id=eos) if llm.draft is not None else NoDraft()
    return {
        "drafter": drafter,
        "drafting": llm.lookup,  # an NGram config drafts by lookup, as the stand-in does, with its settings and pool
        "verifier": verifier,
        "encode": llm.encode,
        "tokenizer": llm.tokenizer,
        "end_id": eos,
        "other_end_ids": tuple(listed_end_ids(folders["target"])) if eos is not None else (),
        "default_k": llm.k,
        "adaptive": False,
        "max_seq_len": llm.max_seq_len,
        "sources": {"engine_source": SOURCE, "draft_engine_source": SOURCE if llm.draft else None},
        # guided requests, where model.yaml names the LLM's guided_decoding_backend (specbuild writes it)
        "vocab_size": llm.rules.vocab_size,
    }
