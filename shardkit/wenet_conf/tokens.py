"""Label lengths as WeNet's tokenizers give them (pure: a transcript in, its tokens out).

WeNet's ``CharTokenizer`` and ``BpeTokenizer`` (``wenet/text/``) reduced to what decides the
length of a label, which the filter's token checks compare: the non-language symbols split out,
CJK characters alone for BPE, and the tokens a symbol table neither holds nor maps to ``<unk>``
dropped. :mod:`shardkit.wenet_conf.load` reads the tokenizer files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Tokenizer:
    """WeNet's char or BPE tokenizer, reduced to what decides the label length.

    ``symbols``: the symbol table's entries (None: no table, every token counts); ``non_lang_syms``:
    None when the conf names no file (WeNet then does not split on them); ``encode``: sentencepiece's
    ``encode_as_pieces`` for BPE, None for the char tokenizer.
    """

    symbols: frozenset[str] | None = None
    non_lang_syms: tuple[str, ...] | None = None
    split_with_space: bool = False
    encode: Callable[[str], list] | None = None
    unk: str = "<unk>"


_NON_LANG = None
_CJK = None


def _patterns():
    global _NON_LANG, _CJK
    if _NON_LANG is None:
        import re

        _NON_LANG = re.compile(r"(\[[^\[\]]+\]|<[^<>]+>|{[^{}]+})")  # char_tokenizer.py
        _CJK = re.compile(r"([\u4e00-\u9fff])")  # tokenize_utils.py
    return _NON_LANG, _CJK


def text_tokens(text: str, tok: Tokenizer) -> list[str]:
    """``text2tokens`` of WeNet's CharTokenizer (``encode`` None) or BpeTokenizer, on a transcript
    as the reader gives it (the tar reader strips it; the tokenizer strips again)."""
    non_lang, cjk = _patterns()
    syms = tok.non_lang_syms or ()
    tokens: list[str] = []
    for part in _parts(text.strip(), tok, non_lang):
        if part in syms:
            tokens.append(part)
        elif tok.encode is not None:
            tokens.extend(_bpe_tokens(part, tok.encode, cjk))
        else:
            tokens.extend(_char_tokens(part, tok.split_with_space))
    return tokens


def _parts(line: str, tok: Tokenizer, non_lang) -> list[str]:
    """The line split at the non-language symbols (upper-cased, as WeNet does) when the conf names them."""
    if tok.non_lang_syms is None:
        return [line]
    parts = non_lang.split(line.upper())
    # the char tokenizer strips each part, the BPE tokenizer does not
    return [w if tok.encode else w.strip() for w in parts if len(w.strip()) > 0]


def _bpe_tokens(part: str, encode: Callable[[str], list], cjk) -> list[str]:
    """``tokenize_by_bpe_model``: CJK characters alone, the rest by sentencepiece."""
    tokens: list[str] = []
    for piece in cjk.split(part.upper()):
        if len(piece.strip()) == 0:
            continue
        if cjk.fullmatch(piece):
            tokens.append(piece)
        else:
            tokens.extend(encode(piece))
    return tokens


def _char_tokens(part: str, split_with_space: bool) -> list[str]:
    """The char tokenizer's tokens: characters (or words, ``split_with_space``), a space as ``▁``."""
    return ["▁" if ch == " " else ch for ch in (part.split(" ") if split_with_space else part)]


def count_tokens(text: str, tok: Tokenizer) -> int:
    """``len(label)``: tokens in the symbol table, or mapped to ``<unk>`` when the table has it
    (``tokens2ids`` drops a token neither in the table nor mappable)."""
    tokens = text_tokens(text, tok)
    if tok.symbols is None or tok.unk in tok.symbols:
        return len(tokens)
    return sum(1 for t in tokens if t in tok.symbols)

