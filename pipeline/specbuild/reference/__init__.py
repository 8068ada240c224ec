"""The reference runtime: a PyTorch Llama (CPU, or CUDA when present) behind TensorRT-LLM's tensor contract.

    from specbuild.reference.loading import load_pair
    pair = load_pair(spec)                     # target + draft in-process
    pair.drafter, pair.verifier                # Drafter / Verifier for specbuild.speculative.loop
    pair.target_model(request_dict)            # the tensorrt_llm model's tensors (reference/contract_model.py)

Modules: model (the Llama forward, batch-invariant), blocks (the fixed row blocks and key buckets it
computes on), exactness (the probe that checks them on this machine), kvcache (per-sequence KV with
rollback, prefix cache), engine (batched logits/decode over the caches), contract_model (the engine
behind the `tensorrt_llm` tensors), batcher (concurrent in-process calls -> one batched execute),
loading (which weights: reference engine or HF checkpoint). A whole generation with text and timing is
`specbuild.session.local`. Importing this package does not import torch; the modules that need it do.
"""
