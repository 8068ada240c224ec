"""specbuild: speculative decoding (draft/target) with TensorRT-LLM, from one spec file.

Stages (one subcommand each, chained by `specbuild up`):
check -> convert -> build -> repo -> serve -> generate / bench.
See DESIGN.md in the project's shared folder and README.md.
"""

__version__ = "0.1.0"
