"""Model families (specbuild.families), each a tiny random checkpoint written by transformers here: `check` calls a
pair usable exactly when `convert` takes it, for every family and backend; the reference runtime computes each family
as transformers does (logits, sliding windows), speculative greedy output at every K up to 8 equals target-only output
and transformers' generate, and sampled speculative output follows the target's own distribution; the engine path
goes from a Hugging Face folder to generated text for every family modelopt exports; a family only the LLM API path
takes converts there; a non-Llama pair streams through both repository kinds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from family_models import (
    ENGINE_FAMILIES,
    LLMAPI_FAMILIES,
    LLMAPI_ONLY_FAMILIES,
    PATHLESS_FAMILIES,
    REFERENCE_FAMILIES,
    SERVED_FAMILIES,
    SHAPES,
    make_family,
)

BACKENDS = ("trtllm", "reference", "llmapi")
PROMPT = "The quick brown fox"


def write_spec(
    folder: Path, target: Path, draft: Path, max_seq_len: int = 252, draft_logits: bool = False, max_draft_len: int = 4
) -> Path:
    path = folder / "specbuild.toml"
    path.write_text(
        f'name = "fam"\noutput_dir = "{folder / "engines"}"\n'
        f'[target]\ncheckpoint = "{target}"\n[draft]\ncheckpoint = "{draft}"\n'
        f"[build]\nmax_batch_size = 2\nmax_input_len = 128\nmax_seq_len = {max_seq_len}\nmax_num_tokens = 512\n"
        f"[speculative]\nmax_draft_len = {max_draft_len}\nnum_draft_tokens = 3\n"
        f'use_draft_logits = {"true" if draft_logits else "false"}\n[gpu]\nname = "H100-80GB"\n'
    )
    return path


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, Path]:
    """family -> the spec of a pair of that family (target 2 layers, draft 1, one tokenizer)."""
    root = tmp_path_factory.mktemp("families")
    specs = {}
    for family in SHAPES:
        chat = family == "qwen3"  # an instruct-style tokenizer: it adds BOS and has a chat template
        target = make_family(root / family / "target", family, seed=0, chat=chat)
        draft = make_family(root / family / "draft", family, hidden=32, layers=1, seed=1, chat=chat)
        specs[family] = write_spec(root / family, target, draft)
    return specs


# ---- check agrees with convert ---------------------------------------------------------------------------------
def verdicts(spec_path: Path, backend: str) -> tuple[bool, bool, str]:
    """(check calls the pair usable as far as its family goes, convert plans it, convert's refusal)."""
    from specbuild.backends import path_of
    from specbuild.check.pair import run_check
    from specbuild.config import load_spec
    from specbuild.convert.plan import ConvertOptions, plan_roles
    from specbuild.errors import SpecError

    spec = load_spec(spec_path)
    report = run_check(spec, scan_weights=False, backend=backend)
    usable = "unsupported_architecture" not in [p["code"] for p in report.to_dict()["problems"]]
    try:
        plan_roles(spec, ["target", "draft"], ConvertOptions(), path=path_of(backend))
        return usable, True, ""
    except SpecError as err:
        return usable, False, str(err)


EXPECTED = {  # family -> the backends that take it (the LLM API path: TensorRT-LLM 1.2.1's registered architectures)
    family: (("trtllm", "reference") if family in ENGINE_FAMILIES else ())
    + (("llmapi",) if family in LLMAPI_FAMILIES else ())
    for family in SHAPES
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_check_calls_a_pair_usable_exactly_when_convert_takes_it(pairs, backend):
    for family, spec_path in pairs.items():
        usable, planned, refusal = verdicts(spec_path, backend)
        assert usable == planned, (family, backend, refusal)
        assert planned == (backend in EXPECTED[family]), (family, backend, refusal)
        if family in LLMAPI_ONLY_FAMILIES and backend != "llmapi":
            assert 'build.backend = "llmapi"' in refusal  # the path that works is named
        if family in ENGINE_FAMILIES and family not in LLMAPI_FAMILIES and backend == "llmapi":
            assert "Unknown architecture for AutoModelForCausalLM" in refusal and 'build.backend = "trtllm"' in refusal
        if family in PATHLESS_FAMILIES:
            assert "no path of TensorRT-LLM 1.2.1" in refusal, refusal


def test_a_release_the_probe_recorded_decides_what_the_llm_api_path_loads(tmp_path, monkeypatch):
    """The GPU image's probe records the installed release; check and convert hold the LLM API path to that release's
    record, and to the pinned release's for one the table does not know."""
    from specbuild import families
    from specbuild.contract import llmapi

    assert families.PINNED_LLM_API_RELEASE == llmapi.RELEASE  # one release pinned, seen from both sides
    record = tmp_path / "record.json"
    monkeypatch.setenv(llmapi.SPELLING_RECORD_ENV, str(record))
    gemma = make_family(tmp_path / "gemma", "gemma")
    spec_path = write_spec(tmp_path, gemma, gemma)
    monkeypatch.setitem(
        families.LLM_API_RELEASES,
        "9.9.9",
        families.LlmApiRelease(
            "9.9.9",
            loads=families.LLM_API_RELEASES["1.2.1"].loads | {"GemmaForCausalLM"},
            applies_window=frozenset(),
            source="a release made up by this test",
        ),
    )
    for installed, takes in (("1.2.1", False), ("9.9.9.post1", True), ("1.2.2", False)):
        record.write_text(json.dumps({"spelling": "pinned", "tensorrt_llm": installed}))
        usable, planned, refusal = verdicts(spec_path, "llmapi")
        assert usable == planned == takes, (installed, refusal)
        if not takes:
            assert "TensorRT-LLM 1.2.1's PyTorch backend" in refusal


def test_a_sliding_window_shorter_than_max_seq_len_is_refused_on_every_path_with_the_fix(tmp_path):
    """The engines attend over the whole sequence, and so does TensorRT-LLM 1.2.1's PyTorch backend (its Mistral
    and Phi-3 attention ignores sliding_window): on either path the output would differ from the model's."""
    target = make_family(tmp_path / "target", "mistral", sliding_window=200)
    spec_path = write_spec(tmp_path, target, target, max_seq_len=252)
    for backend in BACKENDS:
        usable, planned, refusal = verdicts(spec_path, backend)
        assert not usable and not planned, (backend, refusal)
        assert "set build.max_seq_len <= 200" in refusal
        if backend == "llmapi":
            assert "ignores sliding_window" in refusal
    within = write_spec(tmp_path, target, target, max_seq_len=200)
    assert all(verdicts(within, backend)[:2] == (True, True) for backend in BACKENDS)


def test_the_llm_api_stand_in_runs_a_model_as_the_pinned_release_does(tmp_path):
    """The stand-in stops where 1.2.1's LLM stops (an architecture it does not register) and attends as its attention
    does (Mistral's and Phi-3's sliding_window not applied)."""
    from specbuild.llmapi.llm import release_args
    from specbuild.reference.model import args_from_config

    for family, window in (("mistral", 8), ("phi3", 8)):
        config = json.loads((make_family(tmp_path / family, family, sliding_window=window) / "config.json").read_text())
        args = args_from_config(config, family)
        assert set(args.windows) == {window}  # the reference runtime computes the window (the engine path's CPU side)
        assert set(release_args(args, config).windows) == {None}
    for family in PATHLESS_FAMILIES + ("gemma",):
        config = json.loads((make_family(tmp_path / family, family) / "config.json").read_text())
        with pytest.raises(ValueError, match="Unknown architecture for AutoModelForCausalLM: " + SHAPES[family][1]):
            release_args(args_from_config(config, family), config)


def test_the_readme_family_table_says_what_each_path_takes():
    """The README's table of families, read cell by cell, against the rule check and convert apply."""
    import re

    from specbuild import families

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = [line for line in readme.splitlines() if re.match(r"\| `\w+ForCausalLM`", line)]
    assert {re.match(r"\| `(\w+)`", row).group(1) for row in rows} == set(families.FAMILIES)
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        architecture = re.match(r"`(\w+)`", cells[0]).group(1)
        config = {"architectures": [architecture]}
        for cell, path in ((cells[1], "engine"), (cells[2], "llmapi")):
            takes = families.support(architecture, config, path, max_seq_len=None).ok
            assert cell.startswith("yes") == takes, (architecture, path, cell)


# ---- the reference runtime computes each family as transformers does -------------------------------------------
def hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.mark.parametrize(
    "family,window", [(f, None) for f in REFERENCE_FAMILIES] + [("mistral", 8), ("phi3", 8), ("gemma2", 8)]
)
def test_the_runtime_gives_transformers_logits_prefilled_or_decoded(tmp_path, family, window):
    from specbuild.reference.model import LlamaModel

    extra = {"sliding_window": window} if window else {}
    folder = make_family(tmp_path / family, family, tokenizer=False, **extra)
    model = LlamaModel.from_folder(folder)
    ids = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = hf_model(folder)(torch.tensor([ids])).logits[0]
    cache = model.new_cache()
    got = torch.cat([model.forward([(cache, ids[:30])], [30])[0], model.forward([(cache, ids[30:])], [10])[0]])
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    if window:
        assert model.args.sliding_window == window


@pytest.mark.parametrize("family", REFERENCE_FAMILIES)
def test_speculative_greedy_output_equals_target_only_and_transformers_generate(tmp_path, pairs, family):
    from specbuild.config import load_spec
    from specbuild.decode.generation import Options
    from specbuild.session.local import LocalSession

    pair = load_spec(pairs[family])
    spec = load_spec(write_spec(tmp_path, pair.target.checkpoint, pair.draft.checkpoint, max_draft_len=8))
    with LocalSession.from_spec(spec, device="cpu", threads=1, overlap=False) as session:
        runs = {
            k: session.generate(PROMPT, Options(max_tokens=16, num_draft_tokens=k, adaptive=False)) for k in range(0, 9)
        }  # K = 0 and every K up to 8
        prompt = session.encode(PROMPT)
        # every drafter: prompt lookup and the hybrid too, on a prompt that repeats itself (so the lookup finds text)
        quoted = f"{PROMPT} {PROMPT} {PROMPT}"
        plain = session.generate(quoted, Options(max_tokens=16, num_draft_tokens=0, adaptive=False)).output_ids
        by_drafter = {
            (drafter, k): session.generate(
                quoted, Options(max_tokens=16, num_draft_tokens=k, adaptive=False, drafter=drafter)
            )
            for drafter in ("lookup", "hybrid")
            for k in (2, 8)
        }
    assert all(runs[k].steps[0].k == k for k in range(1, 9))  # each K ran as asked, none clamped
    outputs = {k: run.output_ids for k, run in runs.items()}
    assert len(set(outputs[0])) > 4, outputs[0]  # a text that varies, or equality would prove little
    assert all(out == outputs[0] for out in outputs.values()), outputs
    assert all(run.output_ids == plain for run in by_drafter.values()), family
    assert any(run.stats.by_drafter.get("lookup", {}).get("proposals") for run in by_drafter.values())
    with torch.no_grad():
        generated = (
            hf_model(spec.target.checkpoint)
            .generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :]
            .tolist()
        )
    ends = [i for i, token in enumerate(generated) if token == 2]  # transformers keeps the end id; specbuild does not
    assert outputs[0] == generated[: ends[0] if ends else None]


SAMPLES = 1000  # requests per family: the chi-square test below has 16 cells at most


def noisy_copy(source: Path, folder: Path, scale: float, seed: int = 7) -> Path:
    """The checkpoint at source with Gaussian noise of `scale` times each matrix's own spread added to it."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    generator = torch.Generator().manual_seed(seed)
    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        for name, tensor in tensors.items():
            if tensor.dim() == 2:
                noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
                tensors[name] = (tensor.float() + noise * tensor.float().std() * scale).to(tensor.dtype)
        save_file(tensors, path, metadata={"format": "pt"})
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("draft_logits", [True, False], ids=["draft logits", "draft tokens only"])
@pytest.mark.parametrize("family", REFERENCE_FAMILIES)
def test_speculative_sampling_follows_the_targets_own_distribution(tmp_path, pairs, family, draft_logits):
    """Sampled speculative output (K = 2, top-k 4, a temperature of at most 1 at which the first token's top 4 span 2
    nats, one seed per request) is distributed over its first
    two tokens as the target alone samples them, computed exactly from transformers' logits: the chi-square test of
    tests/test_speculative_distribution.py (p > 1e-3), whose toy models also show it rejects wrong acceptance rules.
    Both of TensorRT-LLM's rules: rejection sampling with the draft's logits, and without them the draft's tokens
    taken where the target samples the same. The draft is the target with noise on every matrix, so drafts are both
    accepted and rejected. The negative control: the same samples are rejected as the target's at half the
    temperature."""
    import numpy as np
    from test_speculative_distribution import P_CORRECT, P_WRONG, chi_square_pvalue

    from specbuild.config import load_spec
    from specbuild.decode.generation import Options
    from specbuild.session.local import LocalSession
    from specbuild.speculative.interfaces import SamplingParams
    from specbuild.speculative.sampling import process_logits

    target = load_spec(pairs[family]).target.checkpoint
    draft = noisy_copy(Path(target), tmp_path / "draft", scale=0.1)  # agrees with the target some of the time
    spec = load_spec(write_spec(tmp_path, target, draft, draft_logits=draft_logits))
    model = hf_model(spec.target.checkpoint)

    def logits(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1].double().numpy()

    def exact_joint(prompt: list[int], eos: int | None, sampling: SamplingParams) -> np.ndarray:
        """P(first two tokens) when the target alone samples them; an end id ends the request: (eos, eos) here."""
        first = process_logits(logits(prompt), sampling)
        joint = np.zeros((first.size, first.size))
        for token in np.flatnonzero(first):
            joint[token] = first[token] * process_logits(logits(prompt + [int(token)]), sampling) if token != eos else 0
            joint[token, eos] += first[token] if token == eos else 0.0
        return joint

    with LocalSession.from_spec(spec, device="cpu", threads=1, overlap=False) as session:
        prompt, eos = session.encode(PROMPT), session.end_id
        # a temperature at which the first token's top 4 span 2 nats (1 where they already do): a tiny model whose
        # logits are nearly flat (gemma2's: top 4 at 0.246-0.255) would otherwise give a test with no power
        top = np.sort(logits(prompt))[-4:]
        temperature = float(min(1.0, (top[-1] - top[0]) / 2.0))
        outputs = [
            session.generate(
                PROMPT,
                Options(max_tokens=2, num_draft_tokens=2, adaptive=False, temperature=temperature, top_k=4, seed=seed),
            )
            for seed in range(SAMPLES)
        ]
        drafted = sum(step.drafted for out in outputs for step in out.steps)
        accepted = sum(step.accepted for out in outputs for step in out.steps)
    samples = np.array([(out.output_ids + [eos, eos])[:2] for out in outputs])
    assert 0 < accepted < drafted  # drafts both accepted and rejected: both branches of the rule ran
    joint = exact_joint(prompt, eos, SamplingParams(temperature=temperature, top_k=4))
    assert chi_square_pvalue(samples, joint) > P_CORRECT, family
    # the negative control, at this N: the same samples against the target's distribution at half the temperature
    # (the same top-4 support, other weights: what a sampler that lost the temperature would give) are rejected
    cooler = exact_joint(prompt, eos, SamplingParams(temperature=temperature / 2, top_k=4))
    assert chi_square_pvalue(samples, cooler) < P_WRONG, family


# ---- from a Hugging Face folder to generated text, per path ------------------------------------------------------
def run(*args: str) -> str:
    """The command's stdout (its log goes to stderr)."""
    from click.testing import CliRunner

    from specbuild.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_the_engine_path_converts_verifies_builds_and_generates(pairs, family):
    spec = str(pairs[family])
    assert "verify: passed" in run("convert", "-c", spec, "--verify")
    run("build", "-c", spec, "--backend", "reference")
    docs = [
        json.loads(
            run("generate", "-c", spec, "--local", "--json", "--max-tokens", "12", "--num-draft-tokens", str(k), PROMPT)
        )
        for k in (0, 3)
    ]
    assert docs[0]["engine_source"] == "reference-engine" and docs[0]["output_ids"] == docs[1]["output_ids"]


@pytest.mark.slow
@pytest.mark.parametrize("family", LLMAPI_ONLY_FAMILIES)
def test_a_family_only_the_llm_api_path_takes_converts_there_and_verifies(pairs, family):
    spec = str(pairs[family])
    assert "verify: passed" in run("convert", "-c", spec, "--backend", "llmapi", "--verify")


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.parametrize("family", SERVED_FAMILIES)
def test_every_family_streams_through_each_repository_kind_it_has(tmp_path, pairs, family):
    """From the Hugging Face folders to streamed text through each repository kind the family's paths have: the BLS
    repository on reference engines (engine path) and the llmapi repository on the CPU stand-in (LLM API path),
    token for token the greedy text of in-process decoding (speculative, K = 3). Qwen3 (q/k norm, tied embeddings,
    head_dim apart from hidden / heads) also gets a chat prompt: the template applied on the client, its one BOS
    kept once by the server."""
    from triton_helpers import serving

    from specbuild.config import load_spec
    from specbuild.convert import convert_pair
    from specbuild.decode.generation import Options
    from specbuild.engines.stage import build_engines
    from specbuild.llmapi import build as llmapi_build
    from specbuild.llmapi import checkpoint as llmapi_checkpoint
    from specbuild.llmapi.repository import write_repository as write_llmapi_repository
    from specbuild.session.chat import chat_prompt
    from specbuild.session.local import LocalSession
    from specbuild.session.served import ServedSession
    from specbuild.triton.repository import write_repository

    source = load_spec(pairs[family])
    options = Options(max_tokens=12, num_draft_tokens=3, adaptive=False)
    repos = {}  # repository -> the spec whose weights in-process decoding must match
    if family in ENGINE_FAMILIES:
        (tmp_path / "engine").mkdir()
        spec = load_spec(write_spec(tmp_path / "engine", source.target.checkpoint, source.draft.checkpoint))
        convert_pair(spec, ["target", "draft"], log=lambda m: None)
        build_engines(spec, ["target", "draft"], "reference")
        write_repository(spec, "reference", tmp_path / "bls_repo")
        repos["bls_repo"] = spec  # served from the reference engines, which the local session loads too
    if family in LLMAPI_FAMILIES:
        (tmp_path / "llmapi").mkdir()
        spec = load_spec(write_spec(tmp_path / "llmapi", source.target.checkpoint, source.draft.checkpoint))
        llmapi_checkpoint.convert_pair(spec, ["target", "draft"], log=lambda m: None)
        llmapi_build.build(spec, log=lambda m: None)
        write_llmapi_repository(spec, tmp_path / "llmapi_repo", runtime="reference")
        (tmp_path / "exported").mkdir()
        repos["llmapi_repo"] = load_spec(
            write_spec(
                tmp_path / "exported",
                llmapi_checkpoint.checkpoint_dir(spec, "target"),
                llmapi_checkpoint.checkpoint_dir(spec, "draft"),
            )
        )  # what it serves
    for repo, local_spec in repos.items():
        with LocalSession.from_spec(local_spec, device="cpu", threads=1, overlap=False) as session:
            prompts = [PROMPT] + (
                [chat_prompt(session.tokenizer, "brown fox", system="Be brief.")] if family == "qwen3" else []
            )
            expected = [session.generate(prompt, options) for prompt in prompts]
            tokenizer = session.tokenizer
        with serving(tmp_path / repo, tmp_path / f"{repo}.log") as server:
            with ServedSession(server.grpc_url) as served:
                pieces: list[str] = []
                replies = [served.generate(prompts[0], options, on_text=pieces.append)]
                replies += [served.generate(prompt, options) for prompt in prompts[1:]]
        assert len(pieces) > 2, (family, repo)  # streamed
        for got, want in zip(replies, expected):
            assert got.text.strip() == want.text.strip(), (family, repo, got.text, want.text)
        if family == "qwen3":
            template = tokenizer.apply_chat_template(
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "brown fox"}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
            )
            assert expected[1].prompt_ids == list(template)  # one BOS: the template's, written once


@pytest.mark.slow
@pytest.mark.parametrize("family", SERVED_FAMILIES)
def test_a_draft_with_more_vocabulary_rows_than_the_target_converts_trimmed(tmp_path, family):
    """The draft's embedding has rows past the shared tokenizer (as Qwen2.5 0.5B's 151936 beside 7B's 152064, or
    Llama 3.2 beside 3.1): check says the rows are cut, convert cuts them and verifies, on the family's path."""
    backend = "llmapi" if family in LLMAPI_ONLY_FAMILIES else "reference"
    target = make_family(tmp_path / "target", family, vocab_size=256, tokenizer_vocab=256)
    draft = make_family(tmp_path / "draft", family, vocab_size=288, tokenizer_vocab=256, hidden=32, layers=1, seed=1)
    spec = write_spec(tmp_path, target, draft)
    doc = json.loads(run("check", "-c", str(spec), "--backend", backend, "--json", "--no-weight-scan"))
    assert "vocab_trim" in [w["code"] for w in doc["warnings"]] and not doc["problems"], doc["problems"]
    converted = run("convert", "-c", str(spec), "--verify", *(["--backend", backend] if backend == "llmapi" else []))
    assert converted.count("verify: passed") == 2 and "vocab 256" in converted.split("draft:")[1]


@pytest.mark.slow
@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_the_loader_reads_each_familys_fp8_export_back_within_fp8s_rounding(tmp_path, family):
    """modelopt's fp8 TensorRT-LLM checkpoint of each family, read back by the loader: every quantized weight within
    fp8 e4m3's rounding of the original (half a step at the per-tensor scale: 16 / 448 of the largest value), every
    other tensor (biases, norms, Qwen3's q/k norms, Gemma's 1 + weight, embeddings) within float16's. Random weights
    have too small logit margins for `--verify`'s top-1 bounds, whatever the family (Llama's fail them alike)."""
    from safetensors.torch import load_file

    from specbuild.config import load_spec
    from specbuild.convert import convert_pair
    from specbuild.convert.loader import load_trtllm_checkpoint

    folder = make_family(tmp_path / "model", family)
    spec_path = write_spec(tmp_path, folder, folder)
    spec_path.write_text(spec_path.read_text().replace("[target]\n", '[target]\nquantization = "fp8"\n'))
    spec = load_spec(spec_path)
    convert_pair(spec, ["target"], log=lambda m: None)
    loaded = load_trtllm_checkpoint(spec.pair_dir / "target" / "checkpoint").state_dict
    original = load_file(str(folder / "model.safetensors"))

    def fused(name: str) -> str:  # q/k/v and gate/up share one fp8 scale: TensorRT-LLM fuses them
        for parts, group in ((("q_proj", "k_proj", "v_proj"), "qkv"), (("gate_proj", "up_proj"), "gate_up")):
            for part in parts:
                name = name.replace(part, group)
        return name

    largest: dict[str, float] = {}
    for name, want in original.items():
        largest[fused(name)] = max(largest.get(fused(name), 0.0), float(want.abs().max()))
    quantized = 0
    for name, want in original.items():
        got = loaded[name].float()
        if name.endswith("proj.weight") and "embed" not in name:  # the linears modelopt quantizes
            assert (got - want).abs().max() <= largest[fused(name)] * 16 / 448 * 1.01, name
            quantized += 1
        else:
            scale = (1.0 + want).abs() if family == "gemma" and name.endswith("norm.weight") else want.abs()
            assert torch.all((got - want).abs() <= scale * 2**-11 + 1e-7), name
    assert quantized == 7 * 2  # q, k, v, o, gate, up, down in each of the 2 layers


@pytest.mark.parametrize("modelopt, refused", [("0.37.0", True), ("0.44.0", False), ("0.47.0", False)])
def test_a_qwen_engine_export_modelopt_cannot_write_here_is_refused_by_check_and_convert_alike(
    pairs, monkeypatch, modelopt, refused
):
    """nvidia-modelopt below 0.44 writes a qwen TensorRT-LLM checkpoint only through tensorrt_llm (absent here): check
    reports it and convert refuses it before any work, naming the two ways out; Llama needs nothing of the kind."""
    import importlib.metadata

    version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: modelopt if name == "nvidia-modelopt" else version(name)
    )
    for family, expect in (("qwen2", refused), ("qwen3", refused), ("llama", False)):
        from specbuild.check.pair import run_check
        from specbuild.config import load_spec
        from specbuild.convert.plan import ConvertOptions, plan_roles
        from specbuild.errors import SpecError

        spec = load_spec(pairs[family])
        codes = [p["code"] for p in run_check(spec, scan_weights=False, backend="reference").to_dict()["problems"]]
        assert ("modelopt_cannot_export" in codes) == expect, (family, codes)
        if expect:
            with pytest.raises(SpecError, match=f"nvidia-modelopt {modelopt} exports a qwen"):
                plan_roles(spec, ["target"], ConvertOptions())
        else:
            plan_roles(spec, ["target"], ConvertOptions())
        llmapi = run_check(spec, scan_weights=False, backend="llmapi").to_dict()["problems"]
        assert "modelopt_cannot_export" not in [p["code"] for p in llmapi]  # the Hugging Face export needs no TRT-LLM
