"""specbuild: speculative decoding (draft/target) with TensorRT-LLM, from one spec file.

Stages (one subcommand each, chained by `specbuild up`):
check -> convert -> build -> repo -> serve -> generate / bench.
README.md says how to use it; docs/architecture.md shows the packages and the path of a request.
"""

__version__ = "0.1.0"
