"""Chat prompts: the tokenizer's own chat template applied by transformers (`apply_chat_template`), as text.

    text = chat_prompt(tokenizer, "Write a haiku.", system="Be brief.")
    session.generate(text, options)        # local or served alike: the template is applied by the client

The template is applied where the tokenizer is (the caller's side), never copied into specbuild, and the result is
sent as the prompt text. One detail makes it exact: a template that writes the BOS token itself (Llama 3's
`<|begin_of_text|>`) would get a second one from tokenizers that add BOS when encoding (the BLS and preprocessing
encode prompts with add_special_tokens, as NVIDIA's preprocessing does). So when the tokenizer adds BOS by itself,
the template's leading BOS text is left out: the prompt's token ids are then exactly the template's.
"""

from __future__ import annotations

from typing import Any

from specbuild.errors import RequestError

__all__ = ["chat_prompt", "chat_text", "load_tokenizer"]


def load_tokenizer(folder: Any) -> Any:
    """The tokenizer in `folder` (local files only), for a client that applies the template."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as err:
        raise RequestError(
            f"the tokenizer in {folder} does not load ({err}); chat needs the target's tokenizer."
        ) from None


def chat_prompt(tokenizer: Any, message: str, system: str | None = None) -> str:
    """One user turn (after an optional system turn) through the tokenizer's chat template, with the prompt for the
    assistant's reply, as the text to send."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": message}]
    return chat_text(tokenizer, messages)


def chat_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """A conversation ([{"role": ..., "content": ...}, ...]) through the tokenizer's chat template, with the prompt for
    the assistant's reply, as the text to send."""
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "the target's tokenizer has no chat template (no chat_template in tokenizer_config.json "
            "or chat_template.jinja): send the prompt as plain text, without --chat."
        )
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos) and _adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


def _adds_bos(tokenizer: Any) -> bool:
    ids = tokenizer("x")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id
