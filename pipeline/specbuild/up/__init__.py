"""`specbuild up` as a library: the one stage list (check -> convert -> build -> repo -> serve) for each path, the
context the stages share, and running them in order. `specbuild.cli.up_cmd` only parses options, calls
`stages.run_up` and prints; a CI job or a notebook can call the same. Imports nothing (see docs/architecture.md).
"""
