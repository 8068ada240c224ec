"""TensorRT-LLM's tensor contract, in one place: what crosses the boundary of a `tensorrt_llm` model.

    tensors         every Triton model's inputs and outputs (NVIDIA's inflight_batcher_llm names)
    executor        the executor's request rules and limits (what a request may ask of an engine)
    sampling        what TensorRT-LLM makes of the sampling tensors
    logits          the logits dtype: its names, and which one a pair's engines have
    words           the [2, n] stop/bad word-list format
    backend_params  the C++ backend's model-config parameters, read by its rules
    adapters        the draft/verify loop's Drafter and Verifier over the contract (local and served)
    build_rules     what trtllm-build and the runtime do to an engine by themselves
    bls_params      the BLS's model-config parameters, one typed record
    pbtxt           Triton's config.pbtxt text format
    llmapi          the LLM API path's pinned names and values (Triton's llmapi model, the LLM arguments)

Sources are cited in each module. No torch, no Triton imports: the reference runtime, the Triton
models and the tests share it.
"""
