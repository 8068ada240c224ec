"""The two transports of a generation: a pair loaded in this process, and a Triton server's stream.

    local       LocalSession: a pair loaded in-process (`generate --local`, bench, check --measure)
    served      ServedSession: the one reader of a server's stream (`generate`, `up`, `bench --url`)
    chat        chat prompts through the tokenizer's own template (apply_chat_template), on the client

Both return `specbuild.decode.generation.Generation`; the loop they (and the BLS) drive is `specbuild.decode`.
"""
