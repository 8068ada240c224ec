"""Several end ids (a generation_config.json that lists them, as Llama 3.x instruct models ship) and stop words end a
generation at the same token in-process and through the BLS: both read the end ids with
specbuild.hfmodel.listed_end_ids, from the same files (the reference engine copies the checkpoint's
generation_config.json beside its tokenizer), and both assemble the request with decode.request.RequestRules.
NVIDIA's ensemble, which calls the engine directly, gets the other end ids as stop words from preprocessing; the
llmapi repository's model gets them as stop_token_ids (specbuild.llmapi.end_ids)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from triton_helpers import make_deployment, serving

from specbuild.decode.generation import Options
from specbuild.triton.client import SpecbuildClient

pytestmark = [pytest.mark.server, pytest.mark.slow]
PROMPT = "def add(a, b):"


def three_end_ids(deployment) -> tuple[list[int], int, list[int], list[int]]:
    """(the greedy ids of PROMPT at K = 2 without the end ids, the index where the listed ids cut them, the three ids,
    the prompt's ids): three end ids as Llama 3.x instruct models list them, the tokenizer's, one the text reaches
    later, and the one it reaches first, listed last (the first reached ends it, whatever the order of the list)."""
    from specbuild.session.local import LocalSession

    before = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    try:
        undisturbed = before.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False)).output_ids
        eos, prompt_ids = before.end_id, before.encode(PROMPT)
    finally:
        before.close()
    # an id the greedy text reaches at its fourth token or later, not before
    cut = next(i for i in range(3, len(undisturbed)) if undisturbed[i] not in undisturbed[:i] and undisturbed[i] != eos)
    later = next(
        (t for t in undisturbed[cut + 1 :] if t not in undisturbed[: cut + 1] and t != eos),
        next(t for t in range(3, 10**6) if t not in undisturbed and t != eos),
    )
    return undisturbed, cut, [eos, later, undisturbed[cut]], prompt_ids


def test_a_listed_end_id_or_a_stop_word_ends_the_local_and_the_served_generation_at_the_same_token(
    tmp_path, example_tiny
):
    from specbuild.session.local import LocalSession
    from specbuild.session.served import ServedSession

    deployment = make_deployment(tmp_path, example_tiny)
    engine = deployment.spec.output_dir / deployment.spec.name / "target" / "engine"
    undisturbed, cut, listed, prompt_ids = three_end_ids(deployment)
    (engine / "generation_config.json").write_text(json.dumps({"eos_token_id": listed}))

    local = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    try:
        here = local.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False))
        # a stop word: the text of a token the greedy text reaches before `cut`, which tokenizes back to that token
        tokenizer = local.tokenizer
        stop_at, word = next(
            (i, tokenizer.decode([undisturbed[i]]))
            for i in range(1, cut)
            if tokenizer.encode(tokenizer.decode([undisturbed[i]]), add_special_tokens=False) == [undisturbed[i]]
            and undisturbed[i] not in undisturbed[:i]
        )
        stopped = local.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False, stop=(word,)))
    finally:
        local.close()
    assert here.output_ids == undisturbed[:cut] and here.finish_reason == "stop"
    assert stopped.output_ids == undisturbed[: stop_at + 1]  # the stop word is kept, as TensorRT-LLM keeps it
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
        assert text == tokenizer.decode(prompt_ids + undisturbed[: cut + 1], skip_special_tokens=True)
        with ServedSession(server.grpc_url) as session:
            served = session.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, stop=(word,)))
        assert served.output_ids == stopped.output_ids
        assert (served.finish_reason, served.stop_reason) == ("stop", word)


def test_the_llmapi_repository_stops_at_the_first_listed_end_id_as_the_engine_path_does(tmp_path, example_tiny):
    """TensorRT-LLM's LLM ends at its tokenizer's eos only; the llmapi repository's model sends the checkpoint's other
    end ids with every request as stop_token_ids (specbuild.llmapi.end_ids), so it stops where the local session and
    the BLS stop: finish_reason "stop", stop_reason the id, the id left out of the output, as the LLM API says."""
    from specbuild.llmapi import build
    from specbuild.llmapi.checkpoint import checkpoint_dir, convert_pair
    from specbuild.llmapi.repository import write_repository
    from specbuild.session.local import LocalSession
    from specbuild.session.served import ServedSession

    deployment = make_deployment(tmp_path, example_tiny)
    convert_pair(deployment.spec, ["target", "draft"], log=lambda m: None)
    build.build(deployment.spec, log=lambda m: None)
    write_repository(deployment.spec, tmp_path / "llmapi_repo", runtime="reference")
    undisturbed, cut, listed, _ = three_end_ids(deployment)
    engine = deployment.spec.output_dir / deployment.spec.name / "target" / "engine"
    for folder in (engine, checkpoint_dir(deployment.spec, "target")):  # what each path reads its end ids from
        path = folder / "generation_config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**config, "eos_token_id": listed}))

    with LocalSession.from_spec(deployment.spec, device="cpu", threads=1) as local:
        here = local.generate(PROMPT, Options(max_tokens=24, num_draft_tokens=2, adaptive=False))
    assert here.output_ids == undisturbed[:cut] and here.finish_reason == "stop"

    log = tmp_path / "llmapi.log"
    with serving(tmp_path / "llmapi_repo", log) as server:
        with ServedSession.for_spec(deployment.spec, url=server.grpc_url) as session:  # text only, no ids
            served = session.generate(PROMPT, Options(max_tokens=24))
        body = {
            "text_input": PROMPT,
            "sampling_param_max_tokens": 24,
            "sampling_param_exclude_input_from_output": True,
            "return_finish_reason": True,
            "return_stop_reason": True,
        }
        request = urllib.request.Request(
            f"http://{server.http_url}/v2/models/tensorrt_llm/generate", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            doc = json.loads(response.read())
    assert served.text == here.text and served.output_ids is None and served.finish_reason == "stop"
    assert served.count_estimated and "~" in served.count_text()  # ended on "stop": the text tokenized again
    assert (doc["finish_reason"], doc["stop_reason"]) == ("stop", str(undisturbed[cut]))
    assert doc["text_output"] == served.text
    assert f"other end ids {listed[1:]} go with every request as stop_token_ids" in log.read_text()
