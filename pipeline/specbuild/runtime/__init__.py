"""The reference runtime: a PyTorch Llama (CPU, or CUDA when present) behind TensorRT-LLM's tensor contract.

    from specbuild.runtime.loading import load_pair, model_source, load_contract_model
    pair = load_pair(spec)                     # target + draft in-process
    pair.drafter, pair.verifier                # Drafter / Verifier for specbuild.speculative.loop
    pair.target_model(request_dict)            # the tensorrt_llm contract (runtime/contract.py)

Modules: model (the Llama forward, batch-invariant), kvcache (per-sequence KV with rollback, prefix
cache), engine (batched logits/decode over the caches), contract (tensor contract), batcher (concurrent
in-process calls -> one batched execute), loading (which weights: reference engine or HF checkpoint;
open_model_dir for one folder), textstream (incremental detokenization), speedcheck (K = 0 vs best K).
Importing this package does not import torch; the modules that need it do.
"""
