"""What ``--wenet-conf`` and ``--tokenizer`` load: WeNet's training YAML and its tokenizer files, as a
:class:`TrainerSpec` that plan and balance take.

The meaning of the conf lives in :mod:`shardkit.wenet_conf.conf` and of the tokenizer in
:mod:`shardkit.wenet_conf.tokens` (pure); this module only reads files: the YAML (PyYAML, the
``wenet-conf`` extra), the symbol table and non-language symbols in WeNet's formats
(``wenet/utils/file_utils.py``) and a sentencepiece model (optional dependency, only for a BPE
tokenizer). Every failure is a UsageError that names the file (on the command line, or named by
the conf) and the reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.wenet_conf.conf import ConfError, TokenizerConf, TrainerConf, trainer_conf
from shardkit.wenet_conf.tokens import Tokenizer


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
    if conf.tokenizer not in ("char", "bpe") and override is None:
        return None, f"tokenizer {conf.tokenizer!r} is not modelled: one token per transcript character assumed"
    table_path, bpe_path = _tokenizer_files(conf, conf_path, override)
    if not table_path and not bpe_path:
        return None, "no tokenizer file: one token per transcript character assumed (the index's text_chars)"
    return _read_tokenizer(conf, conf_path, table_path, bpe_path)


def _tokenizer_files(conf: TokenizerConf, conf_path: str, override: str | None) -> tuple[str | None, str | None]:
    """``(symbol table, BPE model)`` paths: ``--tokenizer`` for one of them, the conf's for the rest (a file
    of the conf that is missing is an error, unless ``--tokenizer`` was given: then it is left out)."""
    bpe_override = override if override is not None and override.endswith(".model") else None
    table_override = override if override is not None and bpe_override is None else None
    lenient = override is not None
    table_path = table_override or _conf_file(conf.symbol_table_path, conf_path, "tokenizer_conf.symbol_table_path",
                                              lenient)
    bpe_path = bpe_override or (_conf_file(conf.bpe_path, conf_path, "tokenizer_conf.bpe_path", lenient)
                                if conf.tokenizer == "bpe" else None)
    if conf.tokenizer == "bpe" and not bpe_path:
        raise UsageError("tokenizer 'bpe' needs tokenizer_conf.bpe_path (or --tokenizer MODEL.model)", shard=conf_path)
    return table_path, bpe_path


def _conf_file(value: str | None, conf_path: str, key: str, lenient: bool) -> str | None:
    """The file a tokenizer key of the conf names (None: none named, or ``lenient`` and not found)."""
    if not value:
        return None
    try:
        return resolve_conf_path(value, conf_path, key)
    except UsageError:
        if lenient:
            return None
        raise


def _read_tokenizer(conf: TokenizerConf, conf_path: str, table_path: str | None,
                    bpe_path: str | None) -> tuple[Tokenizer, str]:
    """The tokenizer of these files, and what it is, in words."""
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



@dataclass(frozen=True)
class TrainerSpec:
    """What ``--wenet-conf`` (and ``--tokenizer``) hand to plan and balance."""

    conf: TrainerConf
    conf_path: str
    tokenizer: Tokenizer | None
    tokenizer_note: str

    @property
    def warnings(self) -> list[str]:
        """The warnings the conf's reading raised (options shardkit cannot simulate, and why)."""
        return list(self.conf.warnings)

    def header(self) -> dict:
        """What the report names as its inputs: the conf path and how the tokens were counted."""
        return {"conf": self.conf_path, "tokens": self.tokenizer_note}


def load_spec(conf_path: str, tokenizer: str | None = None) -> TrainerSpec:
    """Read the conf and its tokenizer; every problem is a UsageError naming the file."""
    conf = load_trainer_conf(conf_path)
    tok, note = load_tokenizer(conf.tokenizer, conf_path, tokenizer)
    return TrainerSpec(conf, conf_path, tok, note)



def spec_of_options(wenet_conf: str | None, tokenizer: str | None, dropped_keys: str | None) -> TrainerSpec | None:
    """The loaded ``--wenet-conf`` (None without it); ``--tokenizer`` and ``--dropped-keys`` need it."""
    if wenet_conf is None:
        if tokenizer is not None or dropped_keys is not None:
            raise UsageError("--tokenizer and --dropped-keys need --wenet-conf")
        return None
    return load_spec(wenet_conf, tokenizer)
