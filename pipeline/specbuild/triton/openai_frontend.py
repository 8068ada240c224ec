"""`specbuild serve --server openai`: NVIDIA's OpenAI-compatible frontend in front of the repository (GPU image).

Triton's frontend (triton-inference-server/server `python/openai/openai_frontend/main.py`) starts tritonserver
in-process on a model repository, through the `tritonserver` Python bindings, and serves `/v1/completions`,
`/v1/chat/completions` (chat templates from `--tokenizer`), `/v1/models`, `/metrics` and `/health/ready` on
`--openai-port` (9000 by default); with `--enable-kserve-frontends` the KServe HTTP and gRPC endpoints too, which
specbuild's own client and `generate` keep using. Its requests reach the BLS with TensorRT-LLM's tensors
(`engine/utils/triton.py`, `_create_trtllm_generate_request`), which the BLS declares and honours
(docs/triton.md, "Structured output" and the token counts): a request names the model `tensorrt_llm_bls`.

argv (a list, never a shell string):

    <python> <main.py> --model-repository REPO --tokenizer TOKENIZER_DIR --backend tensorrtllm --host H
        --openai-port P --enable-kserve-frontends --kserve-http-port H2 --kserve-grpc-port G

The frontend and its bindings ship in NVIDIA's Triton images (`/opt/tritonserver/python/openai`, its
`requirements.txt`, the `tritonserver` and `tritonfrontend` wheels in `/opt/tritonserver/python`); they cannot be
installed on a CPU machine from PyPI, so there `find_frontend` says so and `--dry-run` prints the command. The
process is NVIDIA's: SIGTERM stops it at once (its own handler), so this mode has no drain, no supervisor and no
serving gate; `serve` (tritonserver) has them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.contract import models
from specbuild.contract.bls_params import BlsParameters
from specbuild.contract.pbtxt import parse_pbtxt
from specbuild.errors import ArtifactError, ToolNotFoundError
from specbuild.session.served import reachable_host

FRONTEND_ENV = "SPECBUILD_OPENAI_FRONTEND"  # main.py of NVIDIA's frontend, where it is not in the image's place
IMAGE_FRONTEND = Path("/opt/tritonserver/python/openai/openai_frontend/main.py")  # NVIDIA's Triton images
DEFAULT_PORT = 9000  # main.py --openai-port's default
HEALTH = "/health/ready"  # 200 once the engine (tritonserver in-process) is ready


@dataclass
class FrontendCommand:
    argv: list[str]
    host: str
    port: int
    http_port: int
    grpc_port: int

    @property
    def health_url(self) -> str:
        return f"http://{reachable_host(self.host)}:{self.port}{HEALTH}"

    @property
    def base_url(self) -> str:
        return self.health_url.removesuffix(HEALTH) + "/v1"

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": "openai",
            "argv": self.argv,
            "host": self.host,
            "port": self.port,
            "openai": self.base_url,
            "health": self.health_url,
            "kserve": {"http_port": self.http_port, "grpc_port": self.grpc_port},
            "model": models.BLS,
        }


def find_frontend(explicit: str | Path | None = None, python: str = sys.executable) -> Path:
    """NVIDIA's main.py (explicit, $SPECBUILD_OPENAI_FRONTEND, or the image's place), checked to be runnable by
    `python`: ToolNotFoundError says what is missing and where it comes from."""
    where = explicit or os.environ.get(FRONTEND_ENV) or IMAGE_FRONTEND
    path = Path(where)
    if not path.is_file():
        raise ToolNotFoundError(
            f"NVIDIA's OpenAI-compatible frontend is not at {path}: it ships in NVIDIA's Triton images "
            f"({IMAGE_FRONTEND}; docker/Dockerfile.gpu), from triton-inference-server/server python/openai. Pass "
            f"--openai-frontend PATH/main.py (or set {FRONTEND_ENV}). It needs the tritonserver Python bindings, which "
            "PyPI does not have, so it cannot run on this CPU machine: serve with tritonserver (the default --server)."
        )
    probe = subprocess.run(
        [python, "-c", "import tritonserver"], capture_output=True, text=True, timeout=120, check=False
    )
    if probe.returncode != 0:
        raise ToolNotFoundError(
            f"{path} needs the tritonserver Python bindings, which {python} cannot import: in NVIDIA's image "
            "pip install /opt/tritonserver/python/triton*.whl and the frontend's requirements.txt."
        )
    return path


def tokenizer_dir(repo: Path) -> Path:
    """The tokenizer the BLS loads (its config's tokenizer_dir; relative: to the repository, as the BLS resolves it,
    `triton.models.common.resolve_path`): the frontend applies its chat template."""
    config = repo / models.BLS / "config.pbtxt"
    if not config.is_file():
        raise ArtifactError(
            f"{repo} has no {models.BLS}: --server openai serves the engine path's repository (`specbuild repo`)."
        )
    parameters = {key: value.string_value for key, value in parse_pbtxt(config.read_text()).parameters.items()}
    folder = Path(BlsParameters.from_parameters(parameters).tokenizer_dir)
    return folder if folder.is_absolute() else (repo / folder).resolve()


def plan(
    repo: Path,
    main_py: str | Path,
    host: str,
    port: int | None,
    http_port: int,
    grpc_port: int,
    python: str = sys.executable,
) -> FrontendCommand:
    port = DEFAULT_PORT if port is None else port
    argv = [
        python,
        str(main_py),
        "--model-repository",
        str(repo),
        "--tokenizer",
        str(tokenizer_dir(repo)),
        "--backend",
        "tensorrtllm",  # the BLS takes TensorRT-LLM's tensors (main.py --backend: vllm | tensorrtllm)
        "--host",
        host,
        "--openai-port",
        str(port),
        "--enable-kserve-frontends",
        "--kserve-http-port",
        str(http_port),
        "--kserve-grpc-port",
        str(grpc_port),
    ]
    return FrontendCommand(argv, host, port, http_port, grpc_port)
