"""`specbuild selftest`: the first GPU run as one command, one report.

Run in the GPU image on the user's GPU it goes through the risks of the GPU path in order, each step passed or
failed with its evidence and the fix to try: the versions the image carries; convert and build of the built-in
example pair at float16 (then fp8 where the GPU has it); the repository loads in the server; a greedy request at
K = 3 through the BLS equals K = 0 token for token; sampling with draft logits runs; the acceptance figures agree
with the tokens; streaming and cancellation; the requests of NVIDIA's speculative-decoding test (ensemble, BLS and
client-side speculation agree); the LLM API path's probe; a first speed figure, K = 3 against K = 0 through the
server; and one request through the LLM API path's repository (its own stages, its own server). Without a GPU
(or without TensorRT-LLM) the same steps run on the reference backend (the llmapi model's CPU stand-in), so CI
tests the command itself, and the GPU-only steps say "not run (no GPU)" (or, on a GPU without TensorRT-LLM,
"not run (no TensorRT-LLM ...)"), never passed. The fp8 calibration needs a GPU only (modelopt on CUDA), so it runs
wherever torch sees one; its engine build needs TensorRT-LLM.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.example.demo import DEMO_PROMPTS

GREEDY_TOKENS = 32


class StepFailed(Exception):
    def __init__(self, evidence: str, fix: str):
        super().__init__(evidence)
        self.evidence, self.fix = evidence, fix


@dataclass
class Step:
    name: str
    run: Callable[[Run], Any]  # returns the evidence; raises StepFailed (or anything) when it fails
    requires: str | None = (
        None  # "gpu" (a GPU torch sees) or "tensorrt_llm" (a GPU and TensorRT-LLM); None: any machine
    )
    needs: tuple[str, ...] = ()  # steps that must have passed first


@dataclass
class Run:
    workdir: Path
    variant: str
    log: Callable[[str], None]
    gpu: dict[str, Any] | None = None  # name, sm, tensorrt_llm (its version, None when not installed); None: no GPU
    spec: Any = None
    server: Any = None
    results: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trtllm(self) -> bool:
        return bool(self.gpu and self.gpu.get("tensorrt_llm"))

    @property
    def backend(self) -> str:
        return "trtllm" if self.trtllm else "reference"

    def not_run(self, requires: str | None) -> str | None:
        """Why a step that requires this cannot run here; None when it can."""
        if requires is None or (requires == "gpu" and self.gpu) or (requires == "tensorrt_llm" and self.trtllm):
            return None
        if not self.gpu:
            return "not run (no GPU)"
        return (
            f"not run (no TensorRT-LLM: {self.gpu['name']} seen, but tensorrt_llm is not installed; "
            "run inside the GPU image)"
        )


def _versions(run: Run) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    from specbuild import __version__
    from specbuild.triton.install import find_tritonserver

    try:
        tritonserver = str(find_tritonserver(None).binary)
    except Exception as err:  # noqa: BLE001 - reported as evidence; the server step fails with its own message
        tritonserver = f"not found: {err}"
    return {
        "specbuild": __version__,
        "tensorrt_llm": version("tensorrt_llm"),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "nvidia-modelopt": version("nvidia-modelopt"),
        "tritonclient": version("tritonclient"),
        "tritonserver": tritonserver,
        "gpu": run.gpu,
        "backend": run.backend,
    }


def _pair(run: Run) -> str:
    from specbuild.config import known_gpu, load_spec
    from specbuild.example import ensure_example, specfile

    pair = ensure_example(run.variant)
    overrides = specfile.example_overrides(pair, run.variant)
    overrides["output_dir"] = str(run.workdir / "engines")
    overrides["serve"] = {"http_port": 0, "grpc_port": 0, "metrics_port": 0}  # free ports: nothing else is disturbed
    if run.gpu:  # a GPU the spec knows by its memory and SM, else its memory
        name = known_gpu(run.gpu["memory_gib"], run.gpu["sm"])
        overrides["gpu"] = {"name": name} if name else {"name": run.gpu["name"], "memory_gib": run.gpu["memory_gib"]}
    path = specfile.write_spec(
        run.workdir / "specbuild.toml", specfile.render_spec(overrides, header="selftest"), force=True
    )
    run.spec = load_spec(path)
    return f"{pair.root} ({run.variant}); spec {path}"


def _convert(run: Run) -> str:
    from specbuild.convert import convert_pair

    convert_pair(run.spec, ["target", "draft"], log=run.log)
    return f"float16 checkpoints under {run.spec.pair_dir}"


def _build(run: Run) -> str:
    from specbuild.engines.stage import build_engines

    build_engines(run.spec, ["target", "draft"], run.backend)
    return f"{run.backend} engines under {run.spec.pair_dir}"


def _fp8_spec(run: Run):
    import dataclasses

    return dataclasses.replace(
        run.spec,
        output_dir=run.workdir / "engines-fp8",
        target=dataclasses.replace(run.spec.target, quantization="fp8"),
    )


def _fp8_convert(run: Run) -> str:
    from specbuild.convert import convert_pair

    if run.gpu["sm"] < 89:
        return f"not applicable: fp8 needs SM89 or newer, this GPU is SM{run.gpu['sm']}"
    spec = _fp8_spec(run)
    result = convert_pair(spec, ["target"], log=run.log, verify=True)[0]
    check = result.get("verification") or {}
    return (
        f"fp8 target checkpoint calibrated on the GPU under {spec.pair_dir}: top-1 agreement "
        f"{check.get('top1_agreement')} with the float32 model ({check.get('criterion')})"
    )


def _fp8_build(run: Run) -> str:
    from specbuild.engines.stage import build_engines

    if run.gpu["sm"] < 89:
        return f"not applicable: fp8 needs SM89 or newer, this GPU is SM{run.gpu['sm']}"
    spec = _fp8_spec(run)
    build_engines(spec, ["target"], run.backend)
    return f"fp8 target engine under {spec.pair_dir}"


def _start_server(run: Run, repo: Path, log_name: str, check_engines: bool = False):
    """tritonserver on `repo` as `specbuild serve` plans it (the spec's options, free ports), started and ready."""
    from specbuild.triton import serve_plan
    from specbuild.triton.server import ServerHandle

    plan = serve_plan.plan_serve(run.spec, repo)
    if check_engines:
        serve_plan.check_engines(plan.backend, plan.engines)
    server = ServerHandle(plan.options, log_path=run.workdir / log_name, install=plan.install)
    server.start(timeout=600)
    return server


def _serve(run: Run) -> str:
    from specbuild.triton.repository import write_repository

    repo = run.workdir / "triton_repo"
    write_repository(run.spec, run.backend, repo, force=True)
    run.server = _start_server(run, repo, "tritonserver.log", check_engines=True)
    return f"{repo} loaded ({run.backend}); server log {run.server.log_path}"


def _client(run: Run):
    from specbuild.triton.client import SpecbuildClient

    return SpecbuildClient(run.server.grpc_url)


def _greedy(run: Run) -> str:
    prompt = DEMO_PROMPTS[0][1]
    with _client(run) as client:
        ids = {
            k: client.complete(prompt, max_tokens=GREEDY_TOKENS, num_draft_tokens=k)[1]["output_ids"] for k in (0, 3)
        }
    if ids[3] != ids[0]:
        raise StepFailed(
            f"K = 3 gave {ids[3]}, K = 0 gave {ids[0]}",
            "the engines must be exact: check the build log's flags (speculative_decoding_mode "
            "draft_tokens_external on the target) and the logits dtypes",
        )
    return f"{len(ids[0])} tokens, equal at K = 3 and K = 0"


def _sampling(run: Run) -> str:
    with _client(run) as client:
        _, stats = client.complete(
            DEMO_PROMPTS[2][1], max_tokens=16, num_draft_tokens=3, temperature=0.8, seed=1, use_draft_logits=True
        )
    return f"finish_reason {stats.get('finish_reason')}, acceptance {stats.get('acceptance_rate')}"


def _agreement(run: Run) -> str:
    from specbuild.triton.drain import read_metrics

    text = read_metrics(run.server.metrics_url)
    counts = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("specbuild_acceptance_disagreements_total")
    ]
    if not counts:
        raise StepFailed(
            "the BLS exports no specbuild_acceptance_disagreements_total",
            "regenerate the repository with this specbuild (`specbuild repo --force`)",
        )
    if sum(counts) > 0:
        raise StepFailed(
            f"{sum(counts):.0f} verify steps whose total_accepted_draft_tokens differed from the tokens",
            "the tokens decided and the requests went on; read the server log's lines about it and "
            "report them with this report",
        )
    return "total_accepted_draft_tokens agreed with the tokens on every verify step"


def _streaming(run: Run) -> str:
    with _client(run) as client:
        chunks = list(client.generate(DEMO_PROMPTS[0][1], max_tokens=24, num_draft_tokens=3))
        stream = client.generate(DEMO_PROMPTS[1][1], max_tokens=200, num_draft_tokens=3)
        next(stream), next(stream)
        stream.close()  # the client goes away mid-stream: the request is cancelled
        _, after = client.complete(DEMO_PROMPTS[2][1], max_tokens=8, num_draft_tokens=3)
    if len(chunks) < 3:
        raise StepFailed(f"{len(chunks)} responses for 24 tokens", "the BLS must be decoupled (serve.decoupled)")
    return f"{len(chunks)} streamed responses; after a cancelled stream the next request gave {after['finish_reason']}"


def _nvidia_clients(run: Run) -> str:
    """NVIDIA's speculative-decoding test's requests (specbuild.triton.nvidia_requests): the ensemble, the BLS at
    K and client-side speculation through tensorrt_llm_draft / tensorrt_llm give one text per prompt."""
    import tritonclient.grpc as grpcclient

    from specbuild.speculative.draft_len import resolve_k
    from specbuild.triton.nvidia_requests import SPECULATIVE_K, speculative_decoding_check

    k = resolve_k(SPECULATIVE_K, run.spec.speculative.max_draft_len).k
    client = grpcclient.InferenceServerClient(run.server.grpc_url)
    try:
        for _, prompt in DEMO_PROMPTS:
            texts = speculative_decoding_check(client, prompt, k)
            if len(set(texts.values())) > 1:
                raise StepFailed(
                    f"prompt {prompt!r}: {json.dumps(texts)}",
                    "the three must agree, as in NVIDIA's speculative_decoding_test.py: a BLS that "
                    "differs points at the BLS, client-side speculation that differs at the engines' "
                    "draft_input_ids handling (the target's speculative_decoding_mode)",
                )
    finally:
        client.close()
    return (
        f"{len(DEMO_PROMPTS)} prompts: the ensemble, the BLS at K = {k} and client-side speculation "
        "(NVIDIA's client's draft / target calls) gave the same text"
    )


def _llmapi_probe(run: Run) -> str:
    from specbuild.llmapi.probe import probe

    report = probe()
    if not report["ok"]:
        raise StepFailed(
            json.dumps(report), "see docs/llmapi.md: the spelling and field lists in specbuild/contract/llmapi.py"
        )
    return f"TensorRT-LLM {report['tensorrt_llm']} takes the {report['spelling']} spelling"


def _bench(run: Run) -> str:
    from specbuild.decode.generation import Options
    from specbuild.session.served import ServedSession

    rates = {}
    with ServedSession(run.server.grpc_url) as session:
        for k in (0, 3):
            tokens = seconds = 0.0
            for _, prompt in DEMO_PROMPTS:
                generation = session.generate(prompt, Options(max_tokens=48, num_draft_tokens=k))
                tokens, seconds = tokens + generation.output_tokens, seconds + generation.seconds
            rates[k] = tokens / seconds if seconds else 0.0
    return (
        f"{rates[3]:.1f} tokens/s at K = 3, {rates[0]:.1f} at K = 0: {rates[3] / rates[0]:.2f}x "
        f"({'a GPU' if run.gpu else 'the reference backend on CPU'}; `specbuild bench --url` for the full sweep)"
    )


def _llmapi_request(run: Run) -> str:
    """The LLM API path end to end: its stages up to the repository, then one greedy request through Triton's llmapi
    model (NVIDIA's model.py behind specbuild's serving gate where TensorRT-LLM is installed, the CPU stand-in
    elsewhere). The engine path's server is stopped first: two servers' caches need not share one GPU."""
    from specbuild.triton.client import SpecbuildClient
    from specbuild.up.stages import UpContext, run_up

    if run.server is not None:
        run.server.stop()
        run.server = None
    repo = run.workdir / "llmapi_repo"
    ctx = UpContext(spec=run.spec, backend="llmapi", force=False, dry_run=False, once=True, repo=repo, log=run.log)
    _, error = run_up(ctx, until="repo")
    if error is not None:
        raise StepFailed(f"`up --backend llmapi` stopped: {error}", "the message names the stage and what to change")
    server = _start_server(run, repo, "tritonserver-llmapi.log")
    try:
        with SpecbuildClient(server.grpc_url) as client:
            text, stats = client.complete(DEMO_PROMPTS[0][1], max_tokens=GREEDY_TOKENS)
    finally:
        server.stop()
    model = "NVIDIA's llmapi model" if run.trtllm else "the CPU stand-in for the llmapi model"
    if not text or stats.get("finish_reason") not in ("length", "stop"):
        raise StepFailed(
            f"text {text!r}, outputs {json.dumps(stats, default=str)[:500]}",
            f"read {server.log_path}: the model's errors are there",
        )
    return (
        f"{len(text)} characters from {model} ({repo}), finish_reason {stats['finish_reason']}, acceptance "
        f"{stats.get('acceptance_rate')}"
    )


STEPS = (
    Step("versions", _versions),
    Step("example pair", _pair),
    Step("convert float16", _convert, needs=("example pair",)),
    Step("build", _build, needs=("convert float16",)),
    Step("fp8 convert on the GPU", _fp8_convert, requires="gpu", needs=("convert float16",)),
    Step("fp8 engine build", _fp8_build, requires="tensorrt_llm", needs=("build", "fp8 convert on the GPU")),
    Step("repository loads in the server", _serve, needs=("build",)),
    Step("greedy K = 3 equals K = 0", _greedy, needs=("repository loads in the server",)),
    Step("sampling with draft logits", _sampling, needs=("repository loads in the server",)),
    Step("acceptance figures agree with the tokens", _agreement, needs=("greedy K = 3 equals K = 0",)),
    Step("streaming and cancellation", _streaming, needs=("repository loads in the server",)),
    Step("NVIDIA's client requests", _nvidia_clients, needs=("greedy K = 3 equals K = 0",)),
    Step("LLM API probe", _llmapi_probe, requires="tensorrt_llm"),
    Step("first speed figure", _bench, needs=("repository loads in the server",)),
    Step("one LLM API request", _llmapi_request, needs=("example pair",)),
)


def detect_gpu() -> dict[str, Any] | None:
    """The GPU torch sees (name, SM) and the TensorRT-LLM version installed (None: not installed); None: no GPU."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(0)
        try:
            trtllm = importlib.metadata.version("tensorrt_llm")
        except importlib.metadata.PackageNotFoundError:
            trtllm = None
        memory_gib = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        return {
            "name": torch.cuda.get_device_name(0),
            "sm": major * 10 + minor,
            "memory_gib": memory_gib,
            "tensorrt_llm": trtllm,
        }
    except Exception:  # noqa: BLE001 - no usable GPU is an answer, not an error
        return None


def selftest(
    workdir: Path, variant: str = "full", log: Callable[[str], None] = print, gpu: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run every step in order; the report: {"ok", "gpu", "steps": [{"step", "status", "evidence", "fix",
    "seconds"}]}. status: passed, failed, "not run (...)" or "skipped (...)"."""
    run = Run(Path(workdir), variant, log, gpu)
    run.workdir.mkdir(parents=True, exist_ok=True)
    passed: set[str] = set()
    try:
        for step in STEPS:
            row: dict[str, Any] = {"step": step.name}
            missing = [name for name in step.needs if name not in passed]
            if run.not_run(step.requires):
                row["status"] = run.not_run(step.requires)
            elif missing:
                row["status"] = f"skipped ({missing[0]} did not pass)"
            else:
                log(f"selftest: {step.name} ...")
                started = time.monotonic()
                try:
                    row.update(status="passed", evidence=step.run(run))
                    passed.add(step.name)
                except StepFailed as err:
                    row.update(status="failed", evidence=err.evidence, fix=err.fix)
                except Exception as err:  # noqa: BLE001 - any failure is a step's result, with its trace in the log
                    log(traceback.format_exc())
                    row.update(
                        status="failed",
                        evidence=f"{type(err).__name__}: {err}",
                        fix="the message says what to change; the log above has the trace",
                    )
                row["seconds"] = round(time.monotonic() - started, 1)
                log(f"selftest: {step.name}: {row['status']}")
            run.results.append(row)
    finally:
        if run.server is not None:
            run.server.stop()
    return {
        "ok": not any(r["status"] == "failed" for r in run.results),
        "gpu": run.gpu,
        "backend": run.backend,
        "steps": run.results,
    }
