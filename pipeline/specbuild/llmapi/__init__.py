"""The LLM API path: TensorRT-LLM's `LLM(...)` / PyTorch backend with draft/target speculation.

A peer of the engine path (`trtllm`, TensorRT engines built by trtllm-build, last shipped in
TensorRT-LLM 1.2.x) and the CPU path (`reference`), built from the same spec file:

    convert --backend llmapi   Hugging Face checkpoints per role (modelopt export_hf_checkpoint when quantized)
    build --backend llmapi     the LLM arguments, validated against the pinned release (nothing to compile)
    repo --backend llmapi      Triton's `llmapi` model repository (tensorrt_llm/config.pbtxt, 1/model.yaml)
    serve --backend llmapi     tritonserver on that repository, or trtllm-serve (OpenAI-compatible HTTP)

Its contract, every NVIDIA name and value this path writes or serves with its source, is `contract.llmapi`
(data only, in the contract layer, so the client speaks the llmapi model's format). Modules:
`args` (the LLM arguments from the spec), `checkpoint` / `hfexport` (convert), `build`, `repository`, `probe`,
`standin` / `protocol` / `llm` (the CPU stand-in for Triton's llmapi model, its loop driven by
`decode.driver.drive`), `trtllm_serve`. Elsewhere: the wire format in `triton.client`, a generation's K
and token counts in `session.served`, the memory plan in `check.llmapi_memory`, this path's stages for `up` and
the commands in `paths.llmapi_path`.
"""
