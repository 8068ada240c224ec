"""`convert --backend llmapi` on the tiny example pair: Hugging Face checkpoints (modelopt export_hf_checkpoint for
fp8), the round trip, no hf_quant_config.json for an unquantized role, cached and atomic like every stage; and the
stand-in LLM on those checkpoints gives the engine path's target-only greedy ids token for token."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specbuild.cli import main
from specbuild.contract import llmapi as contract
from specbuild.errors import CheckpointError, SpecError

pytestmark = pytest.mark.slow


def _convert(spec_path, *extra):
    return CliRunner().invoke(main, ["convert", "-c", str(spec_path), "--backend", "llmapi", "--json", *extra])


def test_unquantized_checkpoints_have_no_hf_quant_config_and_verify_exactly(tiny_spec_path):
    result = _convert(tiny_spec_path, "--verify")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    for role in doc["roles"]:
        folder = tiny_spec_path.parent / "engines" / "example-tiny" / role["role"] / "hf_checkpoint"
        assert role["checkpoint"] == str(folder) and role["status"] == "ran"
        assert not (folder / contract.HF_QUANT_CONFIG).exists()  # TensorRT-LLM would refuse quant_algo null
        assert (folder / "tokenizer.json").is_file() and (folder / "config.json").is_file()
        assert role["verification"]["passed"] and role["verification"]["top1_agreement"] == 1.0
        assert json.loads((folder / "manifest.json").read_text())["stage"] == "convert-hf"
    again = json.loads(_convert(tiny_spec_path).stdout)  # unchanged inputs: nothing redone
    assert [r["status"] for r in again["roles"]] == ["skipped", "skipped"]


def test_fp8_writes_nvidias_quant_config_and_stays_within_bounds(tiny_spec_path):
    tiny_spec_path.write_text(tiny_spec_path.read_text().replace('quantization = "none"', 'quantization = "fp8"', 1))
    result = _convert(tiny_spec_path, "--role", "target", "--verify")
    assert result.exit_code == 0, result.output
    role = json.loads(result.stdout)["roles"][0]
    folder = tiny_spec_path.parent / "engines" / "example-tiny" / "target" / "hf_checkpoint"
    quant = json.loads((folder / contract.HF_QUANT_CONFIG).read_text())["quantization"]
    assert quant["quant_algo"] == "FP8" and quant["kv_cache_quant_algo"] is None
    assert json.loads((folder / "config.json").read_text())["quantization_config"]["quant_method"] == "modelopt"
    assert role["manifest"]["quant_algo"] == "FP8"
    assert role["verification"]["passed"] and role["verification"]["quant_algo"] == "FP8"


def test_modelopt_037_quant_config_for_an_unquantized_model_is_removed_or_refused(tmp_path):
    from specbuild.llmapi.checkpoint import check_written
    from specbuild.llmapi.hfexport import quant_algo

    null = {
        "producer": {"name": "modelopt", "version": "0.37.0"},
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    }
    (tmp_path / contract.HF_QUANT_CONFIG).write_text(json.dumps(null))
    with pytest.raises(CheckpointError, match="Pre-quantized checkpoint must have quant_algo"):
        quant_algo(tmp_path)

    class Plan:
        role, quantization, quant_algo, kv_cache_quant_algo = "target", "none", None, None

    assert check_written(Plan, tmp_path) == (None, None, ["removed hf_quant_config.json (quant_algo null)"])
    assert not (tmp_path / contract.HF_QUANT_CONFIG).exists()


def test_refusals_before_any_work(tiny_spec_path):
    text = tiny_spec_path.read_text()
    tiny_spec_path.write_text(text.replace('kv_cache = "none"', 'kv_cache = "fp8"', 1))
    result = _convert(tiny_spec_path)
    assert result.exit_code == 1 and "quant_algo null" in result.output
    tiny_spec_path.write_text(text.replace('quantization = "none"', 'quantization = "int4_awq"', 1))
    result = _convert(tiny_spec_path)
    assert result.exit_code == 1 and "not supported on the LLM API path" in result.output


def test_dry_run_writes_nothing(tiny_spec_path):
    result = _convert(tiny_spec_path, "--dry-run")
    assert result.exit_code == 0
    doc = json.loads(result.stdout)
    assert doc["backend"] == "llmapi" and [r["exporter"] for r in doc["roles"]] == ["save_pretrained"] * 2
    assert not (tiny_spec_path.parent / "engines").exists()


def test_a_folder_specbuild_did_not_write_is_not_replaced(tiny_spec_path):
    folder = tiny_spec_path.parent / "engines" / "example-tiny" / "target" / "hf_checkpoint"
    folder.mkdir(parents=True)
    (folder / "mine.txt").write_text("keep")
    result = _convert(tiny_spec_path, "--role", "target", "--force")
    assert result.exit_code == 1 and "was not written by specbuild" in result.output
    assert (folder / "mine.txt").read_text() == "keep"


def test_the_stand_in_llm_gives_the_engine_paths_target_only_ids(tmp_path, example_tiny):
    """Token for token: the llmapi checkpoints in the stand-in LLM (speculating) vs the engine path's reference
    engines decoding target-only in-process (`generate --local`, K = 0)."""
    from triton_helpers import make_deployment

    from specbuild.decode.generation import Options
    from specbuild.llmapi.args import llm_args
    from specbuild.llmapi.build import locations
    from specbuild.llmapi.checkpoint import convert_pair
    from specbuild.llmapi.llm import StandInLLM, sampling_from_request
    from specbuild.session.local import LocalSession

    deployment = make_deployment(tmp_path, example_tiny)
    convert_pair(deployment.spec, ["target", "draft"], log=lambda m: None)
    llm = StandInLLM(llm_args(deployment.spec, locations(deployment.spec)))
    assert llm.k == deployment.spec.speculative.num_draft_tokens and llm.draft is not None
    local = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    for prompt in ("# Copyright", "def add(a, b):", '{"name": '):
        expected = local.generate(prompt, Options(max_tokens=24, num_draft_tokens=0, adaptive=False)).to_dict()
        sampling = sampling_from_request(
            {"max_tokens": 24, "exclude_input_from_output": True, "return_perf_metrics": True}
        )
        outputs = []
        outputs.append(llm.generate(prompt, sampling, streaming=True, on_output=outputs.append))
        final = outputs[-1].outputs[0]
        assert final.token_ids == expected["output_ids"], prompt
        assert final.text == expected["text"] and final.finish_reason == "length"
        metrics = final.request_perf_metrics
        assert metrics["total_draft_tokens"] > 0 and len(outputs) >= 24 // (llm.k + 1)
        assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]


def test_the_stand_in_with_an_ngram_config_drafts_by_lookup_and_gives_the_target_only_ids(tmp_path, example_tiny):
    """NGramDecodingConfig (the spec's drafter "lookup"): no draft model loaded, lookup proposals verified by the
    target, the same ids as target-only decoding; the public pool holds the finished requests."""
    import dataclasses

    from triton_helpers import make_deployment

    from specbuild.decode.generation import Options
    from specbuild.llmapi.args import llm_args
    from specbuild.llmapi.build import locations
    from specbuild.llmapi.checkpoint import convert_pair
    from specbuild.llmapi.llm import StandInLLM, sampling_from_request
    from specbuild.session.local import LocalSession

    deployment = make_deployment(tmp_path, example_tiny)
    spec = deployment.spec
    lookup_spec = dataclasses.replace(
        spec,
        speculative=dataclasses.replace(spec.speculative, drafter="lookup"),
        lookup=dataclasses.replace(spec.lookup, is_public_pool=True),
    )
    convert_pair(spec, ["target"], log=lambda m: None)
    llm = StandInLLM(llm_args(lookup_spec, locations(lookup_spec)))
    assert llm.draft is None and llm.lookup is not None and llm.lookup.settings.is_public_pool
    local = LocalSession.from_spec(spec, device="cpu", threads=1)
    drafted = 0
    for prompt in ("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1,", "def add(a, b):", "def add(a, b):"):
        expected = local.generate(prompt, Options(max_tokens=24, num_draft_tokens=0, adaptive=False)).output_ids
        sampling = sampling_from_request({"max_tokens": 24, "return_perf_metrics": True})
        final = llm.generate(prompt, sampling, streaming=False).outputs[0]
        assert final.token_ids == expected, prompt
        drafted += final.request_perf_metrics["total_draft_tokens"]
    assert drafted > 0 and llm.lookup.pool.figures()["sequences"] == 3


def test_the_stand_in_honours_guided_decoding_params_as_the_engine_path_guides(tmp_path, example_tiny):
    """SamplingParams.guided_decoding (GuidedDecodingParams' fields: json, json_object, regex, grammar) through the
    stand-in LLM, speculating: token for token the engine path's guided run at K = 0 in-process (itself the target's
    constrained greedy, tests/test_guided.py); what the LLM API refuses is refused."""
    from triton_helpers import make_deployment

    from specbuild.decode.generation import Options
    from specbuild.llmapi.args import llm_args
    from specbuild.llmapi.build import locations
    from specbuild.llmapi.checkpoint import convert_pair
    from specbuild.llmapi.llm import StandInLLM, sampling_from_request
    from specbuild.llmapi.protocol import ModelException
    from specbuild.session.local import LocalSession

    deployment = make_deployment(tmp_path, example_tiny)
    convert_pair(deployment.spec, ["target", "draft"], log=lambda m: None)
    args = llm_args(deployment.spec, locations(deployment.spec))
    assert args["guided_decoding_backend"] == "xgrammar"
    llm = StandInLLM(args)
    local = LocalSession.from_spec(deployment.spec, device="cpu", threads=1)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    guides = [
        ({"json": schema}, "json_schema", json.dumps(schema)),
        ({"json": json.dumps(schema)}, "json_schema", json.dumps(schema)),
        ({"regex": "(yes|no), [a-z]{2,10}\\."}, "regex", "(yes|no), [a-z]{2,10}\\."),
        ({"grammar": 'root ::= "(" [a-z]+ ")"'}, "ebnf_grammar", 'root ::= "(" [a-z]+ ")"'),
        ({"json_object": True}, "json", ""),
    ]
    for guided, guide_type, guide in guides:
        for prompt in ("def add(a, b):", "Answer: "):
            options = Options(max_tokens=20, num_draft_tokens=0, guide_type=guide_type, guide=guide)
            expected = local.generate(prompt, options)
            sampling = sampling_from_request({"max_tokens": 20, "guided_decoding": guided})
            final = llm.generate(prompt, sampling, streaming=False).outputs[0]
            assert final.token_ids == expected.output_ids, (guided, prompt)
    with pytest.raises(ModelException, match="Only one guide can be used for a request, but got 2"):
        sampling_from_request({"guided_decoding": {"regex": "a", "json_object": True}})
    with pytest.raises(ModelException, match="structural_tag is not supported"):
        sampling_from_request({"guided_decoding": {"structural_tag": "{}"}})
    without = StandInLLM({key: value for key, value in args.items() if key != "guided_decoding_backend"})
    with pytest.raises(ModelException, match="guided_decoding needs the LLM argument guided_decoding_backend"):
        without.generate("x", sampling_from_request({"guided_decoding": {"json_object": True}}), streaming=False)


def test_build_needs_both_checkpoints(tiny_spec_path):
    result = CliRunner().invoke(main, ["build", "-c", str(tiny_spec_path), "--backend", "llmapi"])
    assert result.exit_code == 1 and "run `specbuild convert --backend llmapi` first" in result.output.lower()


def test_spec_backend_key_is_every_commands_default(tiny_spec_path):
    text = tiny_spec_path.read_text().replace('# backend = "llmapi"', 'backend = "llmapi"', 1)
    assert 'backend = "llmapi"' in text
    tiny_spec_path.write_text(text)
    for command in (
        ["convert", "--dry-run", "--json"],
        ["build", "--dry-run", "--json"],
        ["repo", "--dry-run", "--json"],
    ):
        result = CliRunner().invoke(main, [command[0], "-c", str(tiny_spec_path), *command[1:]])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["backend"] == "llmapi", command
    with pytest.raises(SpecError):
        from specbuild.config import load_spec

        tiny_spec_path.write_text(text.replace('backend = "llmapi"', 'backend = "llm-api"'))
        load_spec(tiny_spec_path)
