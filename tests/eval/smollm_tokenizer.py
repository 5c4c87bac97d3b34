"""The tokenizer of the evaluation's model, built from its GGUF file alone.

SmolLM2's tokenizer is GPT-2 style byte-level BPE (`tokenizer.ggml.model` gpt2,
pre-tokenizer `smollm`): digits split one by one, then GPT-2's byte-level
split. This module builds that tokenizer with the `tokenizers` package (PyPI)
from the vocabulary and merges the GGUF file carries, so the evaluation needs
no other download; special tokens such as <|im_start|> are single tokens.
Checked against llama.cpp's tokenizer of the same file (docs/testing.md).
"""

import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def _strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def load(model_path):
    """A tokenizers.Tokenizer for the GGUF model at `model_path`."""
    reader = gguf.GGUFReader(model_path)
    model_kind = bytes(reader.fields["tokenizer.ggml.model"].parts[-1]).decode()
    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    if model_kind != "gpt2" or pre != "smollm":
        raise ValueError(f"{model_path}: tokenizer {model_kind}/{pre}, expected gpt2/smollm")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
    types = reader.fields["tokenizer.ggml.token_type"]
    kinds = [int(types.parts[i][0]) for i in types.data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    # Control tokens (type 3) match as whole tokens: <|im_start|>, <|endoftext|>, ...
    tok.add_special_tokens([t for t, k in zip(tokens, kinds) if k == 3])
    return tok


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False).ids
