"""Reading what ``--wenet-conf`` needs: WeNet's training YAML, its tokenizer files, and transcripts.

The meaning of the conf lives in :mod:`shardkit.planning.trainer` (pure); this module only reads
files: the YAML (PyYAML, the ``wenet-conf`` extra), the symbol table and non-language symbols in
WeNet's formats (``wenet/utils/file_utils.py``), a sentencepiece model (optional dependency, only
for a BPE tokenizer), and the ``.txt`` members of shards at the offsets an index records. Every
failure is a UsageError (a file named on the command line, or by the conf) or a ShardkitError
(a shard) that names the file and the reason.
"""

from __future__ import annotations

import os
from typing import Sequence

from shardkit.errors import ShardkitError, UsageError
from shardkit.planning.trainer import ConfError, Tokenizer, TokenizerConf, TrainerConf, trainer_conf


def load_trainer_conf(path: str) -> TrainerConf:
    """The :class:`TrainerConf` of a WeNet training YAML; a missing file or bad YAML is a UsageError."""
    try:
        import yaml
    except ImportError:
        raise UsageError("--wenet-conf needs PyYAML: pip install 'shardkit[wenet-conf]'") from None
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as err:
        raise UsageError(f"cannot read the WeNet conf ({err.strerror or err})", shard=path) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError(f"not valid YAML ({where}{problem})", shard=path) from None
    try:
        return trainer_conf(doc, source="WeNet conf")
    except ConfError as err:
        raise UsageError(str(err), shard=path) from None


def resolve_conf_path(value: str, conf_path: str, key: str) -> str:
    """A path the conf names: as given (relative to the working folder), else relative to the conf's
    folder or its parent (WeNet recipes keep ``conf/`` beside ``data/``); a UsageError naming the
    places tried when none exists."""
    tried = [value]
    if not os.path.isabs(value):
        here = os.path.dirname(os.path.abspath(conf_path))
        tried += [os.path.join(here, value), os.path.join(os.path.dirname(here), value)]
    for path in tried:
        if os.path.isfile(path):
            return path
    raise UsageError(f"{key} {value!r} of the conf is not a file (tried {', '.join(tried)}); give the file with "
                     "--tokenizer PATH", shard=conf_path)


def read_symbol_table(path: str) -> frozenset[str]:
    """The symbols of a WeNet units file (``SYMBOL ID`` per line, ``read_symbol_table``)."""
    symbols = set()
    for number, line in enumerate(_read_lines(path, "symbol table"), 1):
        parts = line.strip().split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise UsageError(f"line {number} of the symbol table is not 'SYMBOL ID' (got {line.strip()!r})", shard=path)
        symbols.add(parts[0])
    return frozenset(symbols)


def read_non_lang_symbols(path: str) -> tuple[str, ...]:
    """The non-language symbols file (one per line, ``read_non_lang_symbols``)."""
    return tuple(line.strip() for line in _read_lines(path, "non-language symbols file"))


def _read_lines(path: str, what: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.readlines()
    except OSError as err:
        raise UsageError(f"cannot read the {what} ({err.strerror or err})", shard=path) from None
    except UnicodeDecodeError:
        raise UsageError(f"the {what} is not UTF-8", shard=path) from None


def load_sentencepiece(path: str):
    """``encode_as_pieces`` of a sentencepiece model; a clear error when sentencepiece is missing."""
    try:
        import sentencepiece
    except ImportError:
        raise UsageError(f"a BPE tokenizer ({path}) needs sentencepiece: pip install sentencepiece") from None
    model = sentencepiece.SentencePieceProcessor()
    try:
        model.load(path)
    except (OSError, RuntimeError) as err:
        raise UsageError(f"not a sentencepiece model ({err})", shard=path) from None
    return model.encode_as_pieces


def load_tokenizer(conf: TokenizerConf, conf_path: str, override: str | None = None) -> tuple[Tokenizer | None, str]:
    """``(tokenizer or None, what is assumed, in words)`` for the conf's tokenizer entries.

    ``override`` (``--tokenizer PATH``) replaces the conf's BPE model when it ends in ``.model``,
    else its symbol table; the conf's other file is then used when it can be found, and left out
    (every token counts) when not. No symbol table and no BPE model: None, and the caller counts
    one token per transcript character (the index's ``text_chars``).
    """
    if override is not None and not os.path.isfile(override):
        raise UsageError("--tokenizer: no such file", shard=override)
    bpe_override = override if override is not None and override.endswith(".model") else None
    table_override = override if override is not None and bpe_override is None else None
    if conf.tokenizer not in ("char", "bpe") and override is None:
        return None, f"tokenizer {conf.tokenizer!r} is not modelled: one token per transcript character assumed"

    def conf_file(value: str | None, key: str) -> str | None:
        if not value:
            return None
        if override is None:
            return resolve_conf_path(value, conf_path, key)
        try:
            return resolve_conf_path(value, conf_path, key)
        except UsageError:
            return None

    table_path = table_override or conf_file(conf.symbol_table_path, "tokenizer_conf.symbol_table_path")
    bpe_path = bpe_override or (conf_file(conf.bpe_path, "tokenizer_conf.bpe_path") if conf.tokenizer == "bpe"
                                else None)
    if conf.tokenizer == "bpe" and not bpe_path:
        raise UsageError("tokenizer 'bpe' needs tokenizer_conf.bpe_path (or --tokenizer MODEL.model)", shard=conf_path)
    if not table_path and not bpe_path:
        return None, "no tokenizer file: one token per transcript character assumed (the index's text_chars)"
    symbols = read_symbol_table(table_path) if table_path else None
    non_lang = None
    if conf.non_lang_syms_path:
        non_lang = read_non_lang_symbols(resolve_conf_path(conf.non_lang_syms_path, conf_path,
                                                           "tokenizer_conf.non_lang_syms_path"))
    encode = load_sentencepiece(bpe_path) if bpe_path else None
    tokenizer = Tokenizer(symbols=symbols, non_lang_syms=non_lang, split_with_space=conf.split_with_space,
                          encode=encode)
    name = "BpeTokenizer (sentencepiece " + bpe_path + ")" if bpe_path else "CharTokenizer"
    table = f"symbol table {table_path}" if table_path else "no symbol table: every token counts"
    return tokenizer, f"WeNet's {name}, {table}"


def read_transcripts(shard: str, ranges: Sequence[tuple[int, int]]) -> list[str]:
    """The transcripts at ``(offset, size)`` of the decompressed tar of ``shard`` (ranges ascending,
    as an index records its members), stripped as WeNet's reader strips them.

    A plain shard is read by seeks; a compressed one is decompressed once, streaming.
    """
    from shardkit.io.codecs import detect_codec, iter_decompressed
    from shardkit.io.tar import ChunkReader, open_shard

    out: list[str] = []
    with open_shard(shard) as f:
        codec = detect_codec(f.peek(16)[:16]) if hasattr(f, "peek") else None
        if codec == "none":
            for offset, size in ranges:
                f.seek(offset)
                out.append(_text(f.read(size), size, shard, offset))
            return out
        reader = ChunkReader(iter_decompressed(f, shard=shard, codec=codec))
        position = 0
        for offset, size in ranges:
            if offset < position:
                raise ShardkitError(f"transcript ranges out of order at offset {offset}", shard=shard)
            _skip(reader, offset - position)
            out.append(_text(reader.read(size), size, shard, offset))
            position = offset + size
    return out


def _skip(reader, n: int) -> None:
    while n > 0:
        chunk = reader.read(min(n, 1 << 20))
        if not chunk:
            return
        n -= len(chunk)


def _text(data: bytes, size: int, shard: str, offset: int) -> str:
    if len(data) != size:
        raise ShardkitError(f"the transcript at offset {offset} is cut short (the shard changed since it was "
                            "indexed?)", shard=shard)
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ShardkitError(f"the transcript at offset {offset} is not UTF-8", shard=shard) from None


def transcripts_by_shard(shards: Sequence[str], shard_of, ranges: Sequence[tuple[int, int]],
                         on_shard=None) -> list[str]:
    """Transcripts of many utterances, read shard by shard: utterance i is in ``shards[shard_of[i]]``
    at ``ranges[i]`` = (offset, size) of its ``.txt`` member in the decompressed tar."""
    import numpy as np

    shard_of = np.asarray(shard_of, np.int64)
    texts: list[str] = [""] * len(shard_of)
    if not len(shard_of):
        return texts
    order = np.lexsort((np.asarray([r[0] for r in ranges], np.int64), shard_of))
    cuts = np.flatnonzero(np.diff(shard_of[order])) + 1
    for picked in np.split(order, cuts):
        sid = int(shard_of[picked[0]])
        for i, text in zip(picked.tolist(), read_transcripts(shards[sid], [ranges[i] for i in picked.tolist()])):
            texts[i] = text
        if on_shard:
            on_shard(shards[sid])
    return texts
