"""The build stage: engines for the target and the draft (`specbuild build`).

    engines     the entry points: plan_build, dry_run, build_engines, runtime_versions, versions_mismatch
    plan        what to build per role (RolePlan), checked against trtllm-build's rules
    rules       what trtllm-build and the TensorRT-LLM runtime do to an engine by themselves (also read
                by `check` and `convert`, which is why this __init__ imports nothing)
    flags       the trtllm-build flag table and argv
    trtllm      running trtllm-build (GPU image); reference: the float32 PyTorch engine (any machine)
    versions    the tool versions an engine records and `serve` compares
"""
