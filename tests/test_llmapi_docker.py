"""docker/Dockerfile.llmapi and the compose services of the LLM API path: read and checked here, never built
(no docker engine in CI). The image must carry the pinned release and run specbuild's probe at build time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specbuild.contract import llmapi as contract

DOCKER = Path(__file__).resolve().parent.parent / "docker"


def test_the_pinned_release_is_the_one_the_image_expects():
    text = (DOCKER / "Dockerfile.llmapi").read_text()  # its base image: test_build_docker.py (one constant)
    assert contract.RELEASE.startswith("1.2.") and re.search(r"^ARG EXPECT_TRTLLM=1\.2\.$", text, re.M)


def test_build_checks_what_the_path_runs_then_probes_the_pinned_names():
    text = (DOCKER / "Dockerfile.llmapi").read_text()
    model_dir = re.search(r"^ARG LLMAPI_MODEL_DIR=(\S+)$", text, re.M).group(1)
    assert model_dir == contract.NVIDIA_MODEL_DIR  # where the nvidia_model shim looks
    [checks] = [b for b in re.split(r"\n(?=RUN )", text) if "trtllm-serve" in b and b.startswith("RUN")]
    assert " || " in checks and "\\\n" in checks
    for needle in (
        'test -x "${TRITON_ROOT}/bin/tritonserver"',
        "backends/python/libtriton_python.so",
        'test -f "${LLMAPI_MODEL_DIR}/model.py"',
        'test -f "${LLMAPI_MODEL_DIR}/helpers.py"',
        "command -v trtllm-serve",
        "command -v trtllm-llmapi-launch",
        "m.version('tensorrt_llm')",
        "export_hf_checkpoint",
    ):
        assert needle in checks, needle
    assert text.index(checks) < text.index("COPY pipeline")
    assert "python3 -m specbuild.llmapi.probe" in text.split("COPY pipeline", 1)[1]
    assert "SPECBUILD_LLMAPI_MODEL_DIR=${LLMAPI_MODEL_DIR}" in text


def test_compose_runs_the_llmapi_path_in_that_image():
    yaml = pytest.importorskip("yaml")
    services = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]
    for name in ("build-llmapi", "serve-llmapi", "trtllm-serve"):
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile.llmapi"
        assert services[name]["profiles"] == ["llmapi"] and "../engines:/engines" in services[name]["volumes"]
    assert "--backend llmapi --until build" in services["build-llmapi"]["command"][0]
    assert "--runtime tensorrt_llm" in services["serve-llmapi"]["command"][0]
    assert "--server trtllm-serve" in services["trtllm-serve"]["command"][0]


@pytest.mark.parametrize("name", ["Dockerfile.gpu", "Dockerfile.llmapi"])
def test_every_image_with_tensorrt_llm_records_what_its_release_takes(name):
    """Both GPU images carry TensorRT-LLM and the LLM API path: each runs the probe that records the installed release
    and its spelling (what `repo`, `build`, `check` and `convert` follow there), after specbuild is installed."""
    text = (DOCKER / name).read_text()
    after_install = text.split("bash docker/install_specbuild.sh", 1)[1]
    assert re.match(r" \\\n && python3 -m specbuild\.llmapi\.probe --write\n", after_install), after_install[:80]


def test_the_llmapi_image_has_the_kubectl_the_multi_node_leader_runs():
    """The LeaderWorkerSet's leader waits for its workers with kubectl and mpirun's rsh agent is `kubectl exec`."""
    text = (DOCKER / "Dockerfile.llmapi").read_text()
    [step] = [b for b in re.split(r"\n(?=RUN )", text) if "kubectl version" in b and b.startswith("RUN")]
    assert "sha256sum --check" in step and "kubectl version --client" in step
