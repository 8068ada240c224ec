"""The generation session: every path from a prompt to a finished generation, written once.

    generation  Options (what a caller asks) and Generation (text, finish_reason, figures, timing)
    driver      drive(): the one consumer of the draft/verify loop (in-process and in the BLS)
    request     RequestRules: one request assembled once (K, end ids, stop words) for every in-process path
    chat        chat prompts through the tokenizer's own template (apply_chat_template), on the client
    textstream  incremental detokenization
    local       LocalSession: a pair loaded in-process (`generate --local`, bench, check --measure)
    served      ServedSession: the one reader of a server's stream (`generate`, `up`, `bench --url`)

Above the loop (`speculative`), the contract, the runtime and the Triton client; below the commands.
"""
