"""The child's side of `reference.draftproc`: load the draft model, then answer the parent until it goes.

Run as `python -m specbuild.reference.draftchild FD` by `DraftProcess.start`, with FD one end of a socket
pair. The first message is the load arguments; the answer is ("ready", row block) or the exception. Then
each message is ("call", contract request), ("propose", tokens, k, sampling) or ("ahead", tokens, k,
sampling), answered in order with the result or the exception. EOF (the parent closed the socket or
died) ends the process.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

READY = "ready"


def _serve(conn: Connection) -> None:
    """The child: load the model, then answer requests until the parent closes the socket."""
    try:
        import dataclasses

        import torch

        from specbuild.contract.adapters import ContractDrafter
        from specbuild.reference.loading import load_contract_model
        from specbuild.speculative.overlap import propose_ahead

        source, device, threads, row_block, use_cache, end_id, use_logits = conn.recv()
        source = dataclasses.replace(source, role=f"{source.role} (own process, drafts ahead)")
        if threads is not None:
            torch.set_num_threads(threads)
        model = load_contract_model(source, device, use_cache, row_block)
        drafter = ContractDrafter(model, end_id=end_id, use_logits=use_logits)
    except Exception as err:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(err)
        return
    conn.send((READY, model.engine.model.row_block))
    while True:
        try:
            kind, *args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if kind == "call":
                conn.send(model(*args))
            elif kind == "propose":
                conn.send(drafter.propose(*args))
            else:
                conn.send(propose_ahead(drafter, *args))
        except Exception as err:  # noqa: BLE001 - one bad request fails that call, not the process
            conn.send(err)


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
