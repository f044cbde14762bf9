"""Character-level tokenizer saved as a plain `tokenizer.json` that transformers and SGLang both load."""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
PAD, BOS, EOS, UNK = range(4)
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
VOCAB = SPECIALS + CHARS  # 100 entries; the model's embedding is padded to a multiple of 64
# The messages' contents, joined: a chat request is the completion of its text, so an OpenAI chat client gets what
# a completions client gets for the same prompt. Without a template SGLang answers /v1/chat/completions with 400
# "tokenizer.chat_template is not set"; labkit's models are not instruction-tuned, so no roles are rendered.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def save_char_tokenizer(out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Every character is its own "word"; Fuse joins them back without spaces.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "model_max_length": 4096, "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, indent=2))


def encode(text: str) -> list[int]:
    """Pure-Python encoding identical to the saved tokenizer (no specials added)."""
    index = {c: i for i, c in enumerate(VOCAB)}
    return [index.get(c, UNK) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids if len(SPECIALS) <= i < len(VOCAB))
