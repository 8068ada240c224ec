"""The built-in example pair: a Llama target and a distilled Llama draft sharing one BPE tokenizer,
trained on this machine from the Python standard library's sources (no downloads).

    from specbuild.example import ensure_example
    pair = ensure_example("tiny")   # or "full"; cached, rebuilt only when the recipe changes
    pair.target, pair.draft, pair.info["agreement"]

Light to import: torch and transformers load only when a pair is built.
"""

from specbuild.example.pair import (
    CACHE_ENV,
    EXAMPLE_JSON,
    ExamplePair,
    cache_root,
    cached_example,
    ensure_example,
    example_dir,
    recipe_key,
)

__all__ = [
    "CACHE_ENV",
    "EXAMPLE_JSON",
    "ExamplePair",
    "cache_root",
    "cached_example",
    "ensure_example",
    "example_dir",
    "recipe_key",
]
