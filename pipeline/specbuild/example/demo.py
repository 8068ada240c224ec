"""The demo prompts: what `specbuild up` streams through the speculative server once it is up.

Written by hand in the style of the example pair's training text (standard-library code, docstring
prose, JSON records) and taken from none of it, so they are the same on every machine and never
trained on. A demo must show text, not a loop: for each prompt the example pair's greedy
continuation of `DEMO_MAX_TOKENS` tokens has no token above `MAX_TOP_TOKEN_SHARE` of it
(tests/test_example_demo.py checks it with the bench's own measure, `bench.stats.top_token_share`).
"""

from __future__ import annotations

DEMO_MAX_TOKENS = 48
MAX_TOP_TOKEN_SHARE = 0.4  # most frequent token / all tokens of a demo continuation, at most

DEMO_PROMPTS: tuple[tuple[str, str], ...] = (
    ("code", "PLACEHOLDER"),
    ("json", "PLACEHOLDER"),
    ("prose", "PLACEHOLDER"),
)
