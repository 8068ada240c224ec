"""The bytes-per-token bound behind the BLS's size check: a text of B bytes has at least B / L tokens, so a prompt
longer than max_input_len * L bytes cannot fit and is refused before tokenizing; where a tokenizer can shorten
text (so no such L exists), there is no bound, and each of those cases is shown with a text that breaks it."""

from __future__ import annotations

import math
import random

import pytest

from specbuild.triton.models.token_bytes import max_token_bytes

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n",
    '{"name": "x", "id": 12}',
    "The quick brown fox jumps over the lazy dog.",
    "    for i in range(10):\n        print(i)\n",
    "naïve café — ünïcödé 東京 🙂",
] * 20


def _fast(tok):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _bpe(normalizer=None, pre_tokenizer=None, byte_fallback=False, fuse_unk=False, added=None, decoder=None, also=""):
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=fuse_unk))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    if decoder is not None:
        tok.decoder = decoder
    alphabet = []
    if pre_tokenizer is not None and type(pre_tokenizer).__name__ == "ByteLevel":
        from tokenizers import pre_tokenizers

        alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] * byte_fallback
    tok.train_from_iterator(
        CORPUS + [also] * 50,
        trainers.BpeTrainer(vocab_size=400, special_tokens=specials, initial_alphabet=alphabet, show_progress=False),
    )
    if added is not None:
        tok.add_special_tokens([added])
    return _fast(tok)


def _byte_level():
    from tokenizers import decoders, pre_tokenizers

    return _bpe(pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=False), decoder=decoders.ByteLevel())


def _sentencepiece_style():  # Llama-2 style: "\u2581" for spaces, byte fallback
    from tokenizers import normalizers

    return _bpe(
        normalizer=normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]),
        byte_fallback=True,
    )


def _hard_texts(tokenizer, rng: random.Random) -> list[str]:
    """Texts that pack many bytes into few tokens: runs of the vocabulary's longest tokens, whitespace runs,
    multi-byte characters, and random mixes of vocabulary pieces."""
    vocab = sorted(tokenizer.get_vocab(), key=lambda t: -len(tokenizer.convert_tokens_to_string([t]).encode()))
    pieces = [tokenizer.convert_tokens_to_string([t]) for t in vocab[:40]]
    texts = [p * 50 for p in pieces[:10]]
    texts += [" " * 500, "\n" * 300, "\n" + " " * 19 + "x", "🙂" * 100, "東京" * 100, "é" * 200]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(150)]
    texts += ["".join(rng.choice(CORPUS)[rng.randint(0, 10) :] for _ in range(5)) for _ in range(50)]
    return [t for t in texts if t]


@pytest.mark.parametrize("make", [_byte_level, _sentencepiece_style], ids=["byte-level", "sentencepiece-style"])
def test_no_text_has_fewer_tokens_than_its_bytes_over_the_bound(make):
    tokenizer = make()
    longest = max_token_bytes(tokenizer).longest
    assert longest is not None and longest >= 4
    rng = random.Random(0)
    for text in _hard_texts(tokenizer, rng):
        tokens = len(tokenizer.encode(text, add_special_tokens=False))
        assert tokens >= math.ceil(len(text.encode()) / longest), (text[:40], tokens, longest)


def test_the_example_pairs_tokenizer_has_a_bound_that_holds(example_tiny):
    from specbuild.triton.models.preprocessing import load_tokenizer

    tokenizer = load_tokenizer(example_tiny.target)
    longest = max_token_bytes(tokenizer).longest
    # byte-level: the longest vocabulary token is a newline and 19 spaces, 20 bytes of text (40 bytes as stored)
    assert longest == max(len(t) for t in tokenizer.get_vocab())
    for text in _hard_texts(tokenizer, random.Random(1)):
        assert len(tokenizer.encode(text, add_special_tokens=False)) * longest >= len(text.encode()), text[:40]


def _shortening_cases():
    """(name, tokenizer, a text it packs into fewer tokens than its bytes / longest stored token, the reason)."""
    from tokenizers import AddedToken, normalizers, pre_tokenizers

    return [  # each tokenizer learns a long token of the shortened text, then meets the long form of it
        ("nfc", lambda: _bpe(normalizer=normalizers.NFC(), also="\u00e9" * 32), "e\u0301" * 32, "normalizer NFC"),
        (
            "lowercase",
            lambda: _bpe(normalizer=normalizers.Lowercase(), also="k" * 32),
            "\u212a" * 32,
            "normalizer Lowercase",
        ),
        (
            "whitespace",
            lambda: _bpe(pre_tokenizer=pre_tokenizers.WhitespaceSplit()),
            "a" + " " * 2000 + "b",
            "pre-tokenizer WhitespaceSplit",
        ),
        (
            "lstrip",
            lambda: _bpe(added=AddedToken("<mask>", lstrip=True, special=True)),
            " " * 2000 + "<mask>",
            "swallows neighbouring whitespace",
        ),
        ("fused-unk", lambda: _bpe(fuse_unk=True), "\u0f00" * 500, "fuses a run of unknown characters"),
    ]


@pytest.mark.parametrize("name, make, text, reason", _shortening_cases(), ids=[c[0] for c in _shortening_cases()])
def test_a_tokenizer_that_can_shorten_text_gets_no_bound(name, make, text, reason):
    tokenizer = make()
    bound = max_token_bytes(tokenizer)
    assert bound.longest is None and reason in bound.reason
    # why: this text has more bytes per token than any vocabulary token holds, so a bound read from the
    # vocabulary would refuse a prompt of this kind that fits
    stored = max(len(t.encode()) for t in tokenizer.get_vocab())
    tokens = len(tokenizer.encode(text, add_special_tokens=False))
    assert len(text.encode()) > tokens * stored, (tokens, stored)
