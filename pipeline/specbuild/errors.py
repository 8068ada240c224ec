"""The library's errors. The CLI turns each into a one-line `Error: ...` exactly once.

Every message says what failed, the offending value, and what to do next.
"""


class SpecbuildError(Exception):
    """Base class: a failure the user can act on (exit code 1)."""

    exit_code = 1


class SpecError(SpecbuildError):
    """The spec file (or a CLI override of it) is invalid."""


class CheckpointError(SpecbuildError):
    """A Hugging Face or TensorRT-LLM checkpoint is missing, unreadable or unsupported."""


class PairError(SpecbuildError):
    """Target and draft cannot work together (tokenizers, vocabulary, architecture)."""


class ArtifactError(SpecbuildError):
    """A stage's output or manifest is missing, stale, locked or inconsistent."""


class ToolNotFoundError(SpecbuildError):
    """An external program (trtllm-build, tritonserver) cannot be found."""


class BuildError(SpecbuildError):
    """An engine build failed or produced an engine that disagrees with the request."""


class ServeError(SpecbuildError):
    """The Triton server could not start, became unhealthy, or refused the deployment."""


class ClientError(SpecbuildError):
    """A request to the server failed (connection, invalid argument, server error)."""


class BenchError(SpecbuildError):
    """A benchmark cannot run: bad workload file, bad sweep option, or a transport that failed."""


class GenerationError(SpecbuildError):
    """The draft/verify loop failed: a drafter or verifier broke the interface contract."""


class RequestError(GenerationError):
    """A generation request is invalid (max_tokens, K, sampling, stop sequences); Triton: INVALID_ARG."""
