#!/usr/bin/env bash
# Installs specbuild into NVIDIA's Triton TensorRT-LLM image (docker/Dockerfile.gpu, docker/Dockerfile.llmapi) without
# disturbing NVIDIA's stack, run from the folder holding pyproject.toml and pipeline/:
# - specbuild itself without dependencies: torch, TensorRT(-LLM), transformers and modelopt are the image's;
# - its small pure-Python dependencies, and tritonclient with only the grpc and http clients specbuild uses (the
#   [all] extra also pulls perf-analyzer and cuda-python), at the image's own Triton release when the image says
#   which (${TRITON_ROOT}/TRITON_VERSION), and not at all when the image already has it;
# - then `pip check`: the build fails if the install added a conflict (the image's own, if any, are not ours);
# - and the Python that Triton's Python backend stub embeds (the BLS and the serving gate run in it, not in
#   `python3` on PATH) must import specbuild's served code.
set -euo pipefail

root="${TRITON_ROOT:-/opt/tritonserver}"
before="$(python3 -m pip check 2>&1 || true)"

python3 -m pip install --no-deps .
python3 -m pip install "click>=8.1,<9" "platformdirs>=3,<5" "filelock>=3.12,<5" "tqdm>=4.64,<5" \
  "prometheus-client>=0.20,<1"
if python3 -c "import tritonclient.grpc, tritonclient.http" 2>/dev/null; then
  echo "tritonclient: the image's own"
else
  release="$(tr -d '[:space:]' < "${root}/TRITON_VERSION" 2>/dev/null || true)"
  if [ -n "${release}" ]; then
    python3 -m pip install "tritonclient[grpc,http]==${release}"
  else
    python3 -m pip install "tritonclient[grpc,http]>=2.50,<3"
  fi
fi

after="$(python3 -m pip check 2>&1 || true)"
added="$(comm -13 <(sort <<<"${before}") <(sort <<<"${after}"))"
if [ -n "${added}" ]; then
  echo "installing specbuild broke packages of the image:"
  echo "${added}"
  exit 1
fi

stub="${root}/backends/python/triton_python_backend_stub"
stub_python="$(ldd "${stub}" 2>/dev/null | grep -o 'libpython3\.[0-9]*' | head -n 1 | sed 's/^lib//' || true)"
"${stub_python:-python3}" -c "import specbuild.decode.request, specbuild.triton.models.serving_gate" \
  || { echo "${stub_python:-python3}, the Python of ${stub}, cannot import specbuild"; exit 1; }
specbuild --version
