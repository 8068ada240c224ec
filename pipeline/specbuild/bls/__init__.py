"""The speculative BLS model: the draft/verify loop behind Triton (`tensorrt_llm_bls`)."""
