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
    (
        "code",
        'class Stack:\n    """A last-in, first-out stack of items."""\n\n    def __init__(self):\n'
        "        self._items = []\n\n    def push(self, item):\n",
    ),
    (
        "json",
        '{"id": 1, "type": "user", "name": "Ada Lovelace", "email": "ada.lovelace@example.com", "age": 36, '
        '"city": "Paris", "active": true, "signup_date": "2021-03-14"}\n'
        '{"id": 2, "type": "order", "customer_id": 311, "items": [{"sku": "laptop-142", "qty": 1, "price": '
        '812.5}], "total": 812.5, "tags": ["vip"], "status": "paid"}\n{"id": 3, ',
    ),
    ("prose", "This module provides functions for reading and writing files in a portable way. The functions"),
)
