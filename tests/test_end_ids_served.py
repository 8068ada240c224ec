"""Several end ids (a generation_config.json that lists them, as Llama 3.x instruct models ship) and stop words end a
generation at the same token in-process and through the BLS: both read the end ids with
specbuild.hfmodel.listed_end_ids, from the same files (the reference engine copies the checkpoint's
generation_config.json beside its tokenizer), and both assemble the request with session.request.RequestRules.
NVIDIA's ensemble, which calls the engine directly, gets the other end ids as stop words from preprocessing."""

from __future__ import annotations

import json

import pytest

from specbuild.session.generation import Options
from specbuild.triton.client import SpecbuildClient
from triton_helpers import make_deployment, serving

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPT = "def add(a, b):"


def test_a_listed_end_id_or_a_stop_word_ends_the_local_and_the_served_generation_at_the_same_token(
        tmp_path, example_tiny):
    from specbuild.session.local import LocalSession
    from specbuild.session.served import ServedSession

    deployment = make_deployment(tmp_path, example_tiny)
    engine = deployment.spec.output_dir / deployment.spec.name / "target" / "engine"
    before = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    try:
        undisturbed = before.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False)).output_ids
        eos, prompt_ids, tokenizer = before.end_id, before.encode(PROMPT), before.tokenizer
    finally:
        before.close()
    # an id the greedy text reaches at its fourth token or later, not before
    cut = next(i for i in range(3, len(undisturbed)) if undisturbed[i] not in undisturbed[:i] and undisturbed[i] != eos)
    # three end ids, as Llama 3.x instruct models list: the tokenizer's, one the text reaches later, and the one it
    # reaches first (listed last: the first reached ends it, whatever the order of the list)
    later = next((t for t in undisturbed[cut + 1:] if t not in undisturbed[:cut + 1] and t != eos),
                 next(t for t in range(3, 10**6) if t not in undisturbed and t != eos))
    (engine / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, later, undisturbed[cut]]}))

    local = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    try:
        here = local.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False))
        # a stop word: the text of a token the greedy text reaches before `cut`, which tokenizes back to that token
        tokenizer = local.tokenizer
        stop_at, word = next((i, tokenizer.decode([undisturbed[i]])) for i in range(1, cut)
                             if tokenizer.encode(tokenizer.decode([undisturbed[i]]), add_special_tokens=False)
                             == [undisturbed[i]] and undisturbed[i] not in undisturbed[:i])
        stopped = local.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False, stop=(word,)))
    finally:
        local.close()
    assert here.output_ids == undisturbed[:cut] and here.finish_reason == "stop"
    assert stopped.output_ids == undisturbed[:stop_at + 1]  # the stop word is kept, as TensorRT-LLM keeps it
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", word)

    with serving(deployment.repo, tmp_path / "server.log") as server:
        with SpecbuildClient(server.grpc_url) as client:
            for k in (0, 2):
                chunks = list(client.generate(PROMPT, max_tokens=24, num_draft_tokens=k))
                stats = chunks[-1].stats
                assert stats["output_ids"] == undisturbed[:cut], k
                assert stats["finish_reason"] == "stop", k
        with SpecbuildClient(server.grpc_url, model="ensemble") as client:  # NVIDIA's pipeline, straight to the engine
            text, _ = client.complete(PROMPT, max_tokens=24, stream=False)
        # the other end ids reach the engine as stop words, which TensorRT-LLM keeps in the output
        assert text == tokenizer.decode(prompt_ids + undisturbed[:cut + 1], skip_special_tokens=True)
        with ServedSession(server.grpc_url) as session:
            served = session.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, stop=(word,)))
        assert served.output_ids == stopped.output_ids
        assert (served.finish_reason, served.stop_reason) == ("stop", word)
