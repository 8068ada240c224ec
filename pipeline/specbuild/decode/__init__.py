"""The decode core: one request from its tokens to a finished generation, below every transport.

    request     RequestRules: one request assembled once (K, end ids, stop words), for every path
    driver      drive(): the one consumer of the draft/verify loop (in-process, the BLS, the LLM API stand-in)
    generation  Options (what a caller asks) and Generation (text, finish_reason, figures, timing)
    textstream  incremental detokenization

Imports only `speculative` and `errors`; the transports (`session`, `triton.models.bls`, `llmapi`) import it.
"""
