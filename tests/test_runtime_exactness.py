"""The row-block probe (reference/exactness.py): the runtime picks a block that passes on this machine, falls
back to one row per call when none does, and stays exact either way.

A kernel that breaks invariance is simulated by wrapping the model's matmul (or attention) so that a row's
result depends on its place, its neighbours, the call or the thread count, the way a BLAS code path with a
different summation order per place does (as MKL's AVX2 kernels do here for 7- and 8-row blocks).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from runtime_models import make_llama, prompts, single_thread  # noqa: F401 (autouse fixture)

import specbuild.reference.model as model_module
from specbuild.contract.adapters import ContractDrafter, ContractVerifier
from specbuild.errors import SpecError
from specbuild.reference.blocks import run_blocks
from specbuild.reference.contract_model import ContractModel, Limits
from specbuild.reference.engine import ReferenceEngine
from specbuild.reference.exactness import CPU_CANDIDATES, WIDE_BLOCKS, attention_ends, probe, probe_wide
from specbuild.reference.model import LlamaModel
from specbuild.speculative.loop import GenerationRequest, run

VOCAB = 211


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    make_llama(folder, layers=2, hidden=64, intermediate=160, vocab=VOCAB)
    return folder


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("draft")
    make_llama(folder, seed=5, layers=1, hidden=32, intermediate=64, vocab=VOCAB)
    return folder


def place_dependent_matmul(monkeypatch, when=lambda: True):
    """Every matmul adds 1e-3 x the row's place in its block (0 for a row alone in its call) while when()."""
    real = model_module._linear

    def linear(x, weight_t, bias=None):
        out = real(x, weight_t, bias)
        return out + 1e-3 * torch.arange(x.shape[0], dtype=out.dtype)[:, None] if when() else out

    monkeypatch.setattr(model_module, "_linear", linear)


def verification_equals_single_steps(model) -> bool:
    """Bit for bit: a 5-row verification against 5 one-token steps, beside another sequence."""
    base, other, draft = *prompts(2, VOCAB, seed=8, min_len=7, max_len=9), [5, 6, 7, 8]
    rows = ReferenceEngine(model).logits([other, base + draft], [3, 5])[1]
    single = [ReferenceEngine(model, use_cache=False).logits([base + draft[:j]], [1])[0][0] for j in range(5)]
    return all(np.array_equal(a, b) for a, b in zip(rows, single))


def greedy_outputs(target, draft_folder, ks=(0, 1, 3)) -> list[dict[int, list[int]]]:
    """Greedy tokens for K in ks, per prompt, through the contract path the CLI and the BLS use."""
    verifier = ContractVerifier(ContractModel(ReferenceEngine(target), Limits(max_draft_len=4)), max_draft_len=4)
    drafter = ContractDrafter(ContractModel(ReferenceEngine(LlamaModel.from_folder(draft_folder))))
    return [
        {k: run(ids, drafter, verifier, GenerationRequest(max_tokens=16, num_draft_tokens=k)).tokens for k in ks}
        for ids in prompts(6, VOCAB, seed=21)
    ]


def test_the_runtime_takes_the_first_candidate_that_passes_here(folder):
    model = LlamaModel.from_folder(folder)
    choice = model.exactness
    tried = [t.row_block for t in choice.tried]
    assert tried == [*CPU_CANDIDATES, 1][: len(tried)] and model.row_block == tried[-1]
    assert choice.exact and not choice.tried[-1].failures and all(t.failures for t in choice.tried[:-1])
    assert choice.mode == ("safe" if model.row_block == 1 else "probed")
    assert choice.threads == torch.get_num_threads()
    for trial in choice.tried:  # the probe is deterministic: the same verdict again
        assert bool(probe(model, trial.row_block)) == bool(trial.failures)
    assert verification_equals_single_steps(model)  # and reality agrees with it


def test_speculative_greedy_equals_target_only_with_the_chosen_block(folder, draft_folder):
    model = LlamaModel.from_folder(folder)
    drafted_outputs = greedy_outputs(model, draft_folder, ks=(0, 1, 2, 4))
    for outputs in drafted_outputs:
        assert outputs[1] == outputs[0] and outputs[2] == outputs[0] and outputs[4] == outputs[0]
    assert len({tuple(o[0]) for o in drafted_outputs}) == len(drafted_outputs)  # varied output, not one repeated token


def test_speculative_greedy_equals_target_only_on_the_example_pair(tiny_spec_path):
    """The path of `generate --local`: load_pair (probed target and draft) and the draft/verify loop."""
    from transformers import AutoTokenizer

    from specbuild.config import load_spec
    from specbuild.corpus import heldout_prompts
    from specbuild.reference.loading import load_pair

    pair = load_pair(load_spec(tiny_spec_path), device="cpu")
    assert pair.target_model.engine.model.exactness.exact
    tokenizer = AutoTokenizer.from_pretrained(str(pair.tokenizer_dir), local_files_only=True)
    accepted = drafted = 0
    for text in [t for kind in ("code", "prose", "json") for t in heldout_prompts(kind, 3, chars=120)]:
        ids = tokenizer(text)["input_ids"]
        request = lambda k: GenerationRequest(max_tokens=16, num_draft_tokens=k, end_id=pair.end_id)  # noqa: E731
        target_only = run(ids, pair.drafter, pair.verifier, request(0)).tokens
        for k in (2, pair.max_draft_len):
            result = run(ids, pair.drafter, pair.verifier, request(k))
            assert result.tokens == target_only, (k, text)
            accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
    assert 0 < accepted < drafted  # drafts were both accepted and rejected: verification really ran


def test_a_matmul_that_depends_on_the_rows_place_makes_the_runtime_fall_back_to_one_row_and_stay_exact(
    folder, draft_folder, monkeypatch
):
    place_dependent_matmul(monkeypatch)
    fixed = LlamaModel.from_folder(folder, row_block=4, probe=False)  # the block the runtime assumed before probing
    model = LlamaModel.from_folder(folder)
    choice = model.exactness
    assert (model.row_block, choice.mode, choice.exact) == (1, "safe", True)
    assert [t.row_block for t in choice.tried] == [*CPU_CANDIDATES, 1]
    for trial in choice.tried[:-1]:  # (attention may fail too, on a machine whose kernels break it at that block)
        assert "lm_head 64x211: place" in trial.failures and "qkv 64x128: place" in trial.failures
    assert "safe mode" in choice.describe() and "4 rows failed (qkv 64x128: place" in choice.describe()
    assert not verification_equals_single_steps(fixed)  # the perturbation is real: a fixed block is not exact
    assert verification_equals_single_steps(model)
    for outputs in greedy_outputs(model, draft_folder):
        assert outputs[1] == outputs[0] and outputs[3] == outputs[0]  # speculative greedy == target-only


def prefill_equals_single_steps(model, length: int = 150) -> bool:
    """Bit for bit: every position's logits of one prefill of `length` tokens (its rows in wide calls where the
    model has them) against the same positions decoded one token at a time."""
    ids = prompts(1, VOCAB, seed=3, min_len=length, max_len=length)[0]
    prefill = ReferenceEngine(model, use_cache=False).logits([ids], [length - 1])[0]
    cache = model.new_cache()
    model.forward([(cache, ids[:1])], [1])
    steps = [model.forward([(cache, [token])], [1])[0][0].numpy() for token in ids[1:-1]]
    return all(np.array_equal(a, b) for a, b in zip(prefill, steps))


def test_a_prefill_runs_in_wide_calls_only_where_they_give_each_row_its_blocks_bits(folder, monkeypatch):
    model = LlamaModel.from_folder(folder)
    choice = model.exactness
    assert [t.row_block for t in choice.wide_tried] == [w for w in WIDE_BLOCKS if w > model.row_block]
    assert model.wide_blocks == choice.wide_blocks == tuple(t.row_block for t in choice.wide_tried if not t.failures)
    for trial in choice.wide_tried:  # deterministic: the same verdict again
        assert bool(probe_wide(model, model.row_block, trial.row_block)) == bool(trial.failures)
    assert prefill_equals_single_steps(model)  # and reality agrees with it

    real = model_module._linear  # now a matmul whose bits change once a call holds more than 8 rows
    monkeypatch.setattr(model_module, "_linear", lambda x, *args: real(x, *args) + (1e-3 if x.shape[0] > 8 else 0.0))
    model = LlamaModel.from_folder(folder)
    assert model.row_block == 4 and model.wide_blocks == () and model.exactness.exact
    assert [t.failures for t in model.exactness.wide_tried] == [
        ("qkv 64x128: 64-row call", "o 64x64 + mlp 64x320, 160x64: 64-row call"),
        ("qkv 64x128: 16-row call", "o 64x64 + mlp 64x320, 160x64: 16-row call"),
    ]
    assert "prefill in blocks (64-row calls differ: qkv 64x128: 64-row call" in model.exactness.describe()
    assert prefill_equals_single_steps(model)
    model.wide_blocks = WIDE_BLOCKS  # the perturbation is real: wide calls unprobed would not be exact
    assert not prefill_equals_single_steps(model)


def test_run_blocks_takes_the_largest_calls_that_fit_then_the_next_then_blocks():
    shapes = []
    x = torch.arange(180.0)[:, None]
    out = run_blocks(lambda b: shapes.append(b.shape[0]) or b * 2, [x], 4, (64, 16))
    assert shapes == [64, 64, 16, 16, 16, 4] and torch.equal(out, x * 2)
    shapes.clear()
    run_blocks(lambda b: shapes.append(b.shape[0]) or b, [x[:12]], 4, (64, 16))
    assert shapes == [4, 4, 4]


def test_attention_that_depends_on_its_neighbours_is_caught_and_one_row_is_exact(folder, monkeypatch):
    import torch.nn.functional as F

    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F,
        "scaled_dot_product_attention",
        lambda q, *args, **kwargs: real(q, *args, **kwargs) + q.mean(dim=2, keepdim=True),
    )
    fixed = LlamaModel.from_folder(folder, row_block=4, probe=False)
    failures = probe(fixed, 4)
    assert failures == [f"attention over {end} keys: place/neighbours" for end in attention_ends(512)]
    model = LlamaModel.from_folder(folder)
    assert model.row_block == 1 and model.exactness.exact
    assert verification_equals_single_steps(model) and not verification_equals_single_steps(fixed)


def test_a_kernel_that_differs_from_call_to_call_is_reported_not_exact(folder, monkeypatch):
    calls = itertools.count()
    real = model_module._linear
    monkeypatch.setattr(model_module, "_linear", lambda *args: real(*args) + 1e-3 * (next(calls) % 2))
    with pytest.warns(RuntimeWarning, match="NOT EXACT: even one row per call gave different bits"):
        model = LlamaModel.from_folder(folder)
    assert (model.row_block, model.exactness.mode, model.exactness.exact) == (1, "safe", False)
    assert all(t.failures for t in model.exactness.tried)


def test_a_requested_block_is_used_only_if_it_passes(folder, monkeypatch):
    passes = not probe(LlamaModel.from_folder(folder, row_block=8, probe=False), 8)
    if passes:
        model = LlamaModel.from_folder(folder, row_block=8)
        assert (model.row_block, model.exactness.mode) == (8, "requested")
    else:
        with pytest.raises(SpecError, match="row block 8 is not exact on this machine"):
            LlamaModel.from_folder(folder, row_block=8)
    place_dependent_matmul(monkeypatch)
    with pytest.raises(
        SpecError,
        match=r"row block 4 is not exact on this machine: .*\(qkv 64x128: place, .*"
        r"Leave --row-block out",
    ):
        LlamaModel.from_folder(folder, row_block=4)
    assert LlamaModel.from_folder(folder, row_block=1).exactness.mode == "requested"


def test_a_new_thread_count_is_probed_again_before_the_next_forward(folder, monkeypatch, capsys):
    """Seen with MKL's SSE4.2 kernels: 5-row blocks invariant with 1 thread, not with 2."""
    previous = torch.get_num_threads()
    place_dependent_matmul(monkeypatch, when=lambda: torch.get_num_threads() == 2)
    model = LlamaModel.from_folder(folder)
    assert model.exactness.threads == previous == 1 and model.exactness.exact
    torch.set_num_threads(2)
    try:
        exact = verification_equals_single_steps(model)
        assert (model.row_block, model.exactness.threads, model.exactness.mode) == (1, 2, "safe")
        assert exact
    finally:
        torch.set_num_threads(previous)
    assert (
        "torch threads changed from 1 to 2 since the row-block probe; probed again: row block 1"
        in capsys.readouterr().err
    )


def test_attention_ends_cover_every_bucket_up_to_1024_then_powers_of_two_and_the_longest():
    assert attention_ends(1) == [64]
    assert attention_ends(512) == list(range(64, 513, 64))
    assert attention_ends(3000) == [*range(64, 1025, 64), 2048, 3008]
    assert attention_ends(4096) == [*range(64, 1025, 64), 2048, 4096]


def test_load_contract_model_logs_its_choice_with_verbose(tmp_path, capsys, monkeypatch):
    """The row block is for contributors: on stderr with --verbose (SPECBUILD_VERBOSE) only."""
    from specbuild.progress import VERBOSE_ENV
    from specbuild.reference.loading import HF_CHECKPOINT, ModelSource, load_contract_model

    make_llama(tmp_path, layers=1)
    source = ModelSource("target", tmp_path, HF_CHECKPOINT, {"max_seq_len": 700})
    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    model = load_contract_model(source, device="cpu")
    assert "row block" not in capsys.readouterr().err
    monkeypatch.setenv(VERBOSE_ENV, "1")
    model = load_contract_model(source, device="cpu")
    choice = model.engine.model.exactness
    assert model.engine.model.max_len == 700  # the attention probe covers the engine's longest sequence
    assert f"specbuild: target (cpu, 1 thread): row block {choice.row_block} (probed" in capsys.readouterr().err
    plain = load_contract_model(
        ModelSource("target", tmp_path, HF_CHECKPOINT, {}), device="cpu", row_block=1, probe=False
    )
    assert plain.engine.model.exactness is None and plain.engine.model.row_block == 1


# -- through the CLI: `generate --local --json` reports the choice and stays exact in the safe mode -----------


def generate_json(spec_path, *args, verbose=False):
    import json

    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(
        main,
        [
            *["--verbose"] * verbose,
            "generate",
            "--local",
            "-c",
            str(spec_path),
            "--json",
            "--max-tokens",
            "12",
            "--no-adaptive",
            *map(str, args),
            "def read_config(path):",
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), result.stderr


def test_generate_json_reports_the_row_block_choice(tiny_spec_path, monkeypatch):
    from specbuild.progress import VERBOSE_ENV

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    quiet, stderr = generate_json(tiny_spec_path)
    assert "row block" not in stderr and quiet["exactness"]["target"]["exact"]  # in the document, not in the log
    monkeypatch.setenv(VERBOSE_ENV, "")  # restored after the test: --verbose sets it for the processes it starts
    doc, stderr = generate_json(tiny_spec_path, verbose=True)
    for role in ("target", "draft"):
        choice = doc["exactness"][role]
        last = choice["tried"][-1]
        assert choice["exact"] is True and (last["row_block"], last["passed"], last["failures"]) == (
            choice["row_block"],
            True,
            [],
        )
        assert all(not t["passed"] and t["failures"] for t in choice["tried"][:-1])
        assert f"specbuild: {role} (cpu, 1 thread): row block {choice['row_block']} (" in stderr
    assert doc["row_block"] == doc["exactness"]["target"]["row_block"]


def test_generate_falls_back_to_one_row_when_no_block_passes_and_speculation_stays_exact(tiny_spec_path, monkeypatch):
    place_dependent_matmul(monkeypatch)
    speculative, stderr = generate_json(tiny_spec_path, "--num-draft-tokens", 3)
    target_only, _ = generate_json(tiny_spec_path, "--num-draft-tokens", 0)
    choice = speculative["exactness"]["target"]
    assert (speculative["row_block"], choice["mode"], choice["exact"]) == (1, "safe", True)
    assert [t["row_block"] for t in choice["tried"]] == [*CPU_CANDIDATES, 1]
    assert "row block 1, safe mode (one row per call: exact, slower): 4 rows failed (qkv" in stderr
    assert speculative["drafted"] > 0 and speculative["output_ids"] == target_only["output_ids"]


def test_each_triton_reference_model_probes_in_its_own_process(tmp_path, capsys):
    """The CPU Triton models load through the same runtime: the model's process probes and logs its choice."""
    import json

    from specbuild.triton.models.reference_llm import load_engine

    make_llama(tmp_path, layers=1)
    (tmp_path / "engine.json").write_text(
        json.dumps({"role": "target", "max_batch_size": 2, "max_seq_len": 300, "max_draft_len": 4})
    )
    (tmp_path / "manifest.json").write_text(json.dumps({"backend": "reference"}))
    model = load_engine(tmp_path, device="cpu").engine.model
    assert model.exactness.exact and model.max_len == 300
    assert f"specbuild: target (cpu, 1 thread): row block {model.row_block} (" in capsys.readouterr().err
