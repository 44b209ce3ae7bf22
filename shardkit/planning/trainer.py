"""The trainer's view of a shard list: WeNet's ``dataset_conf`` as numbers, its filter and its batching.

Pure (numbers in, numbers out, no I/O): :mod:`shardkit.io.wenet_conf` reads the YAML and the
tokenizer files, the commands feed arrays taken from the index. Everything follows WeNet's
``wenet/dataset/dataset.py`` and ``processor.py`` (read at 01546996, see WENET_FORMAT.md):

    list shuffle -> (rank, worker) split -> tokenize -> filter -> resample -> speed perturb ->
    features -> spec_trim -> shuffle buffer -> sort buffer -> batch (static | bucket | dynamic)

What is exact and what is a model:

* the **filter** is exact: frames = samples / sample_rate * 100 before resampling, token counts
  as the tokenizer gives them (see :func:`count_tokens`), the same comparisons in float64;
* **feature frames** are exact for fbank/mfcc (Kaldi framing, ``snip_edges``) and Whisper's
  log-mel (``n // hop``); resampling gives ``ceil(n * new / old)`` samples (torchaudio); speed
  perturbation (sox ``speed``, random per utterance) is drawn with numpy from the conf's speeds
  and gives ``round(n / speed)`` samples (sox can differ by a sample);
* **static and bucket** batch counts per worker do not depend on the order of the samples: they
  are exact for the epoch's list shuffle (numpy's permutation, as ``shardkit plan``);
* **dynamic** batches depend on the order the shuffle buffer leaves. The buffer (torch's
  ``Shuffler``: once full, each new sample swaps with a uniformly chosen one) is modelled as: each
  sample leaves after a geometric wait of mean ``shuffle_size`` steps (the chance of being picked
  at each step), samples ordered by leaving time. Sort buffers and the dynamic window are then
  exact. The figures are one draw for the epoch's seed, like the list shuffle.

Batches per rank: the DataLoader (``batch_size=None``) takes batches from its workers in turn
and skips a worker that ran dry, so a rank's steps = the sum of its workers' batches, and the
batches a rank steps last are its busiest workers' last ones. ``equal_steps`` stops every rank
at the smallest rank's count: a rank leaves out (its steps - the minimum) batches, the last ones
in that order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from shardkit.planning.partition import shuffled_order
from shardkit.planning.radix import stable_argsort


class ConfError(ValueError):
    """A value of the conf that WeNet would reject or that cannot be planned (the reader names the file)."""

# ---------------------------------------------------------------------------------------------
# The conf


@dataclass(frozen=True)
class FilterConf:
    """``filter_conf``; defaults are ``processor.filter``'s keyword defaults."""

    max_length: float = 10240
    min_length: float = 10
    token_max_length: float = 200
    token_min_length: float = 1
    min_output_input_ratio: float = 0.0005
    max_output_input_ratio: float = 1


@dataclass(frozen=True)
class FeatureConf:
    """``feats_type`` (dataset.py default ``fbank``) and what of its conf decides the frame count.

    fbank/mfcc: ``compute_fbank``/``compute_mfcc`` defaults ``frame_length=25``, ``frame_shift=10`` (ms),
    Kaldi framing with ``snip_edges`` (torchaudio's default, WeNet does not change it).
    log_mel_spectrogram: ``compute_log_mel_spectrogram`` defaults ``n_fft=400``, ``hop_length=160``,
    ``padding=0``, ``pad_or_trim=False``, ``max_duration=30``.
    """

    feats_type: str = "fbank"
    frame_length: float = 25
    frame_shift: float = 10
    hop_length: int = 160
    padding: int = 0
    pad_or_trim: bool = False
    max_duration: int = 30


@dataclass(frozen=True)
class BatchConf:
    """``batch_conf``: dataset.py defaults ``batch_type='static'``, ``batch_size=16``,
    ``max_frames_in_batch=12000``; bucket needs ``bucket_boundaries`` and ``bucket_batch_sizes``."""

    batch_type: str = "static"
    batch_size: int = 16
    max_frames_in_batch: int = 12000
    bucket_boundaries: tuple[int, ...] = ()
    bucket_batch_sizes: tuple[int, ...] = ()


@dataclass(frozen=True)
class TokenizerConf:
    """``tokenizer`` / ``tokenizer_conf`` (``wenet/utils/init_tokenizer.py``): type default ``char``,
    ``split_with_space`` default False; paths are None when the conf names none."""

    tokenizer: str = "char"
    symbol_table_path: str | None = None
    bpe_path: str | None = None
    non_lang_syms_path: str | None = None
    split_with_space: bool = False


@dataclass(frozen=True)
class TrainerConf:
    """What of a WeNet training conf decides which utterances train and how they batch.

    Defaults are WeNet's: ``resample_rate`` 16000 (``processor.resample``), ``speed_perturb`` False
    and speeds (0.9, 1.0, 1.1) (``processor.speed_perturb``), ``shuffle``/``sort``/``list_shuffle``
    True and ``cycle`` 1 (dataset.py), ``shuffle_size`` 10000 (torch's ``Shuffler`` and the older
    ``processor.shuffle``; current dataset.py requires the key), ``sort_size`` 500 (``SortDataPipe``
    and the older ``processor.sort``; also required by current dataset.py), ``spec_trim`` False
    with ``max_t`` 20 (``processor.spec_trim``). ``warnings`` name every field not modelled.
    """

    filter: FilterConf = field(default_factory=FilterConf)
    features: FeatureConf = field(default_factory=FeatureConf)
    batch: BatchConf = field(default_factory=BatchConf)
    tokenizer: TokenizerConf = field(default_factory=TokenizerConf)
    resample_rate: int = 16000
    speed_perturb: bool = False
    speeds: tuple[float, ...] = (0.9, 1.0, 1.1)
    shuffle: bool = True
    shuffle_size: int = 10000
    sort: bool = True
    sort_size: int = 500
    list_shuffle: bool = True
    cycle: int = 1
    spec_trim: bool = False
    spec_trim_max_t: int = 20
    warnings: tuple[str, ...] = ()


# dataset_conf keys that cannot change which utterances train or how many frames they have
_NO_EFFECT = {"spec_aug", "spec_aug_conf", "spec_sub", "spec_sub_conf", "singal_channel_conf", "language_conf",
              "speaker_conf"}
_FEATURE_CONFS = {"fbank": "fbank_conf", "mfcc": "mfcc_conf", "log_mel_spectrogram": "log_mel_spectrogram_conf"}
# keys of the feature confs that change the frame count, and those that only change values
_FRAME_KEYS = {"fbank": {"frame_length", "frame_shift"}, "mfcc": {"frame_length", "frame_shift"},
               "log_mel_spectrogram": {"n_fft", "hop_length", "padding", "pad_or_trim", "max_duration"}}
_VALUE_KEYS = {"fbank": {"num_mel_bins", "dither", "window_type"},
               "mfcc": {"num_mel_bins", "dither", "num_ceps", "high_freq", "low_freq"},
               "log_mel_spectrogram": {"num_mel_bins"}}
_TOKENIZER_KEYS = {"symbol_table_path", "bpe_path", "non_lang_syms_path", "split_with_space"}
# tokenizer_conf keys that do not change a token count
_TOKENIZER_NO_EFFECT = {"connect_symbol", "is_multilingual", "num_languages", "special_tokens"}


class _Conf:
    """Reads one mapping of the conf, collecting a warning for every key it does not use."""

    def __init__(self, where: str, mapping, warnings: list[str]):
        if mapping is None:
            mapping = {}
        if not isinstance(mapping, Mapping):
            raise ConfError(f"{where} must be a mapping (got {type(mapping).__name__})")
        self.where, self.mapping, self.warnings, self.used = where, mapping, warnings, set()

    def get(self, key: str, default, kind: Callable = float):
        self.used.add(key)
        value = self.mapping.get(key, default)
        if value is None:
            return default
        try:
            if kind is bool and not isinstance(value, bool):
                raise ValueError
            return kind(value)
        except (TypeError, ValueError):
            raise ConfError(f"{self.where}.{key}: expected {kind.__name__}, got {value!r}") from None

    def sub(self, key: str) -> _Conf:
        self.used.add(key)
        return _Conf(f"{self.where}.{key}", self.mapping.get(key), self.warnings)

    def ignore(self, keys: Iterable[str]) -> None:
        self.used.update(keys)

    def finish(self, what: str = "not modelled by shardkit") -> None:
        for key in self.mapping:
            if key not in self.used:
                self.warnings.append(f"{self.where}.{key} is {what}; the plan ignores it")


def _int_tuple(conf: _Conf, key: str) -> tuple[int, ...]:
    conf.used.add(key)
    value = conf.mapping.get(key) or ()
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfError(f"{conf.where}.{key}: expected a list of integers, got {value!r}") from None


def trainer_conf(doc, *, source: str = "conf") -> TrainerConf:
    """A :class:`TrainerConf` from a parsed WeNet training YAML (a mapping); bad values are a ConfError.

    Read: ``dataset_conf`` (every key: used, known to change no count, or warned about), and the
    tokenizer entries (``tokenizer``, ``tokenizer_conf``). The model and optimiser sections are not
    data and are not read. A value of the wrong type is an error naming ``source`` and the key.
    """
    if not isinstance(doc, Mapping):
        raise ConfError(f"{source}: a WeNet training conf is a mapping (got {type(doc).__name__})")
    warnings: list[str] = []
    if "dataset_conf" not in doc:
        warnings.append("the conf has no dataset_conf: WeNet's defaults are assumed throughout")
    if doc.get("dataset", "asr") != "asr":
        warnings.append(f"dataset: {doc.get('dataset')!r} is not modelled (the plan follows the 'asr' dataset)")
    ds = _Conf("dataset_conf", doc.get("dataset_conf"), warnings)
    filt = _filter_conf(ds.sub("filter_conf"))
    features = _feature_conf(ds)
    batch = _batch_conf(ds.sub("batch_conf"))
    resample = ds.sub("resample_conf")
    resample_rate = resample.get("resample_rate", 16000, int)
    resample.finish()
    speed = ds.mapping.get("speed_perturb", False)
    ds.used.add("speed_perturb")
    speeds = (0.9, 1.0, 1.1)
    if isinstance(speed, Mapping):  # some forks give the speeds; WeNet's own takes a bool
        speeds = tuple(float(s) for s in speed.get("speeds", speeds))
    shuffle_conf, sort_conf = ds.sub("shuffle_conf"), ds.sub("sort_conf")
    list_conf = ds.sub("list_shuffle_conf")
    list_size = list_conf.get("shuffle_size", None, int)
    list_conf.finish()
    if list_size is not None:
        warnings.append(f"dataset_conf.list_shuffle_conf.shuffle_size {list_size}: a buffered list shuffle is "
                        "modelled as a shuffle of the whole list")
    trim_conf = ds.sub("spec_trim_conf")
    conf = TrainerConf(
        filter=filt, features=features, batch=batch, tokenizer=_tokenizer_conf(doc, warnings),
        resample_rate=resample_rate, speed_perturb=bool(speed), speeds=speeds,
        shuffle=ds.get("shuffle", True, bool), shuffle_size=shuffle_conf.get("shuffle_size", 10000, int),
        sort=ds.get("sort", True, bool), sort_size=sort_conf.get("sort_size", 500, int),
        list_shuffle=ds.get("list_shuffle", True, bool), cycle=ds.get("cycle", 1, int),
        spec_trim=ds.get("spec_trim", False, bool), spec_trim_max_t=trim_conf.get("max_t", 20, int))
    for sub in (shuffle_conf, sort_conf, trim_conf):
        sub.finish()
    ds.ignore(_NO_EFFECT)
    ds.finish()
    _check_conf(conf, source)
    return _replace(conf, warnings=tuple(warnings))


def _replace(conf: TrainerConf, **changes) -> TrainerConf:
    import dataclasses

    return dataclasses.replace(conf, **changes)


def _filter_conf(conf: _Conf) -> FilterConf:
    d = FilterConf()
    result = FilterConf(**{k: conf.get(k, getattr(d, k)) for k in (
        "max_length", "min_length", "token_max_length", "token_min_length", "min_output_input_ratio",
        "max_output_input_ratio")})
    conf.finish("not a parameter of WeNet's filter (the trainer would reject it)")
    return result


def _feature_conf(ds: _Conf) -> FeatureConf:
    feats_type = ds.get("feats_type", "fbank", str)
    if feats_type not in _FEATURE_CONFS:
        raise ConfError(f"dataset_conf.feats_type {feats_type!r}: WeNet knows {', '.join(_FEATURE_CONFS)}")
    d = FeatureConf()
    for other_type, key in _FEATURE_CONFS.items():  # the confs of other feature types are never read by WeNet
        if other_type != feats_type:
            ds.used.add(key)
    fc = ds.sub(_FEATURE_CONFS[feats_type])
    if feats_type == "log_mel_spectrogram":
        result = FeatureConf(feats_type, hop_length=fc.get("hop_length", d.hop_length, int),
                             padding=fc.get("padding", d.padding, int),
                             pad_or_trim=fc.get("pad_or_trim", d.pad_or_trim, bool),
                             max_duration=fc.get("max_duration", d.max_duration, int))
        fc.get("n_fft", 400, int)  # the frame count does not depend on it (center=True STFT)
    else:
        result = FeatureConf(feats_type, frame_length=fc.get("frame_length", d.frame_length),
                             frame_shift=fc.get("frame_shift", d.frame_shift))
    fc.ignore(_VALUE_KEYS[feats_type])
    fc.finish()
    return result


def _batch_conf(conf: _Conf) -> BatchConf:
    d = BatchConf()
    batch_type = conf.get("batch_type", d.batch_type, str)
    if batch_type not in ("static", "dynamic", "bucket"):
        raise ConfError(f"dataset_conf.batch_conf.batch_type {batch_type!r}: WeNet knows static, bucket, dynamic")
    result = BatchConf(batch_type, conf.get("batch_size", d.batch_size, int),
                       conf.get("max_frames_in_batch", d.max_frames_in_batch, int),
                       _int_tuple(conf, "bucket_boundaries"), _int_tuple(conf, "bucket_batch_sizes"))
    conf.finish()
    return result


def _tokenizer_conf(doc: Mapping, warnings: list[str]) -> TokenizerConf:
    tok_type = doc.get("tokenizer", "char")
    conf = _Conf("tokenizer_conf", doc.get("tokenizer_conf"), warnings)
    if tok_type not in ("char", "bpe"):
        warnings.append(f"tokenizer {tok_type!r} is not modelled: tokens are counted as one per character")
        conf.ignore(conf.mapping)
        return TokenizerConf(str(tok_type))

    def path(key):
        conf.used.add(key)
        value = conf.mapping.get(key)
        return None if value in (None, "", "null") else str(value)

    result = TokenizerConf(tok_type, path("symbol_table_path"), path("bpe_path") if tok_type == "bpe" else None,
                           path("non_lang_syms_path"), conf.get("split_with_space", False, bool))
    conf.ignore(_TOKENIZER_NO_EFFECT | _TOKENIZER_KEYS)
    conf.finish()
    return result


def _check_conf(conf: TrainerConf, source: str) -> None:
    """Values WeNet would reject or that make no batches; a ConfError naming the key."""
    b = conf.batch
    problems = []
    if b.batch_type == "static" and b.batch_size < 1:
        problems.append(f"batch_conf.batch_size must be >= 1 (got {b.batch_size})")
    if b.batch_type == "dynamic" and b.max_frames_in_batch < 1:
        problems.append(f"batch_conf.max_frames_in_batch must be >= 1 (got {b.max_frames_in_batch})")
    if b.batch_type == "bucket":
        if len(b.bucket_batch_sizes) != len(b.bucket_boundaries) + 1:
            problems.append("batch_conf.bucket_batch_sizes needs one more entry than bucket_boundaries "
                            f"(got {len(b.bucket_batch_sizes)} and {len(b.bucket_boundaries)})")
        if any(s < 1 for s in b.bucket_batch_sizes):
            problems.append("batch_conf.bucket_batch_sizes must all be >= 1")
    if conf.shuffle and conf.shuffle_size < 1:
        problems.append(f"shuffle_conf.shuffle_size must be >= 1 (got {conf.shuffle_size})")
    if conf.sort and conf.sort_size < 1:
        problems.append(f"sort_conf.sort_size must be >= 1 (got {conf.sort_size})")
    if conf.cycle < 1:
        problems.append(f"cycle must be >= 1 (got {conf.cycle})")
    if conf.resample_rate < 1:
        problems.append(f"resample_conf.resample_rate must be >= 1 (got {conf.resample_rate})")
    if conf.speed_perturb and (not conf.speeds or any(s <= 0 for s in conf.speeds)):
        problems.append("speed_perturb speeds must be > 0")
    if problems:
        raise ConfError(f"{source}: dataset_conf." + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# Tokens


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
    line = text.strip()
    if tok.non_lang_syms is not None:
        parts = non_lang.split(line.upper())
        # the char tokenizer strips each part, the BPE tokenizer does not
        parts = [w if tok.encode else w.strip() for w in parts if len(w.strip()) > 0]
    else:
        parts = [line]
    syms = tok.non_lang_syms or ()
    tokens: list[str] = []
    for part in parts:
        if part in syms:
            tokens.append(part)
        elif tok.encode is not None:  # tokenize_by_bpe_model: CJK characters alone, the rest by sentencepiece
            for piece in cjk.split(part.upper()):
                if len(piece.strip()) == 0:
                    continue
                if cjk.fullmatch(piece):
                    tokens.append(piece)
                else:
                    tokens.extend(tok.encode(piece))
        else:
            for ch in (part.split(" ") if tok.split_with_space else part):
                tokens.append("▁" if ch == " " else ch)
    return tokens


def count_tokens(text: str, tok: Tokenizer) -> int:
    """``len(label)``: tokens in the symbol table, or mapped to ``<unk>`` when the table has it
    (``tokens2ids`` drops a token neither in the table nor mappable)."""
    tokens = text_tokens(text, tok)
    if tok.symbols is None or tok.unk in tok.symbols:
        return len(tokens)
    return sum(1 for t in tokens if t in tok.symbols)


# ---------------------------------------------------------------------------------------------
# The filter

REASONS = ("kept", "min_length", "max_length", "token_min_length", "token_max_length", "min_output_input_ratio",
           "max_output_input_ratio")


def filter_reasons(samples, sample_rate, tokens, conf: FilterConf) -> np.ndarray:
    """Per utterance the index in :data:`REASONS` of the first check of ``processor.filter`` it fails (0: kept).

    ``samples``/``sample_rate``: the decoded audio's frames and rate (before resampling);
    ``tokens``: label lengths, or None for samples without a label (then only frames are checked).
    """
    samples = np.asarray(samples, np.float64)
    rate = np.asarray(sample_rate, np.float64)
    num_frames = samples / rate * 100
    reason = np.zeros(len(samples), np.int8)

    def mark(code, failed):
        reason[(reason == 0) & failed] = code

    mark(1, num_frames < conf.min_length)
    mark(2, num_frames > conf.max_length)
    if tokens is not None:
        t = np.asarray(tokens, np.float64)
        mark(3, t < conf.token_min_length)
        mark(4, t > conf.token_max_length)
        nonzero = num_frames != 0
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = t / num_frames
        mark(5, nonzero & (ratio < conf.min_output_input_ratio))
        mark(6, nonzero & (ratio > conf.max_output_input_ratio))
    return reason


# ---------------------------------------------------------------------------------------------
# Feature frames


def _ms_samples(rate: int, ms: float) -> int:
    """torchaudio kaldi's ``int(sample_frequency * ms * 0.001)`` (the float product as Python does it)."""
    return int(float(rate) * ms * 0.001)


def feature_frames(samples, sample_rate, conf: TrainerConf, *, seed_seq: Sequence[int] = (0,),
                   dtype=np.int64, chunk: int = 1 << 20) -> np.ndarray:
    """Feature frames per utterance after resample, speed perturb, features and spec_trim (``dtype``,
    int64 unless asked; the simulation asks int32).

    The random parts (the speed of each utterance, spec_trim's length) are drawn with numpy's
    ``default_rng(seed_seq)``: one draw, as the trainer makes one per epoch. The draws are made for
    every utterance at once (a generator's bounded integers depend on how many are drawn per call),
    the arithmetic ``chunk`` utterances at a time, so that its int64 temporaries stay small.
    """
    samples, sample_rate = np.asarray(samples), np.asarray(sample_rate)
    total = len(samples)
    rng = np.random.default_rng(list(seed_seq))
    speed_idx = trim = None
    if conf.speed_perturb:
        speed_idx = _compact(rng.integers(0, len(conf.speeds), total))
    if conf.spec_trim:
        trim = _compact(rng.integers(1, conf.spec_trim_max_t + 1, total))
    out = np.empty(total, dtype)
    for a in range(0, total, chunk) if total else ():
        b = min(a + chunk, total)
        part = _frames_of(samples[a:b], sample_rate[a:b], conf, None if speed_idx is None else speed_idx[a:b],
                          None if trim is None else trim[a:b])
        if len(part) and int(part.max()) > np.iinfo(out.dtype).max:  # a compact dtype too small: widen
            out = out.astype(np.int64)
        out[a:b] = part
    return out


def _compact(values: np.ndarray) -> np.ndarray:
    """Small non-negative integers in the smallest dtype that holds them."""
    top = int(values.max()) if len(values) else 0
    return values.astype(np.uint8 if top < 256 else np.uint16 if top < 65536 else np.int64)


def _frames_of(samples, sample_rate, conf: TrainerConf, speed_idx, trim) -> np.ndarray:
    """:func:`feature_frames` of one chunk, given its random draws (int64)."""
    n = np.asarray(samples, np.int64)
    rate = np.asarray(sample_rate, np.int64)
    target = conf.resample_rate
    changed = rate != target
    if changed.any():  # torchaudio Resample: ceil(n * new / orig) with the rates reduced by their gcd
        g = np.gcd(rate, target)
        new, orig = target // g, rate // g
        n = np.where(changed, -(-(n * new) // orig), n)
    if speed_idx is not None:
        speeds = np.asarray(conf.speeds, np.float64)[speed_idx]
        if len(n) and int(n.max()) < (1 << 53):  # n / 1.0 is n exactly: no need to keep those apart
            n = np.rint(n / speeds).astype(np.int64)
        else:
            n = np.where(speeds != 1.0, np.rint(n / speeds).astype(np.int64), n)
    f = conf.features
    if f.feats_type == "log_mel_spectrogram":
        n = n + f.padding
        if f.pad_or_trim:
            n = np.full(len(n), f.max_duration * target, np.int64)
        frames = n // f.hop_length
    else:
        size = _ms_samples(target, f.frame_length)  # every sample is at the resample rate now
        shift = max(_ms_samples(target, f.frame_shift), 1)
        frames = np.where(n < size, 0, 1 + (n - size) // shift)
    if trim is not None:
        frames = np.where(trim < frames / 2, frames - trim, frames)
    return frames.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Order within a worker: shuffle buffer, then sort buffer


def consumer_utterances(shard_offsets: np.ndarray, order: np.ndarray, consumers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(utterance ids in reading order, start of each consumer in it)`` for one epoch's list order.

    ``shard_offsets``: CSR offsets (shard i's utterances are ``shard_offsets[i]:shard_offsets[i+1]``,
    in shard order); ``order[p]``: the shard read at list position p; position p goes to consumer
    ``p mod consumers``, which reads its positions in order.
    """
    positions = np.arange(len(order))
    by_consumer = np.argsort(positions % consumers, kind="stable")
    seq = order[by_consumer]
    lengths = (shard_offsets[1:] - shard_offsets[:-1])[seq]
    total = int(lengths.sum())
    starts = shard_offsets[:-1][seq]
    # expand each shard of the sequence into its utterance ids (a vectorised concatenation of ranges)
    ends_before = np.cumsum(lengths) - lengths
    utts = np.arange(total, dtype=np.int64) + np.repeat(starts - ends_before, lengths)
    shards_per_consumer = np.bincount(positions % consumers, minlength=consumers)
    consumer_of_seq = np.repeat(np.arange(consumers), shards_per_consumer)
    per_consumer = np.bincount(consumer_of_seq, weights=lengths, minlength=consumers).astype(np.int64)
    return utts, np.concatenate([[0], np.cumsum(per_consumer)])


def _positions(bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(consumer, position within the consumer)`` of every element of a consumer-contiguous sequence."""
    sizes = np.diff(bounds)
    consumer = np.repeat(np.arange(len(sizes)), sizes)
    return consumer, np.arange(int(bounds[-1]), dtype=np.int64) - bounds[:-1][consumer]


def buffered_order(frames: np.ndarray, bounds: np.ndarray, conf: TrainerConf, rng: np.random.Generator) -> np.ndarray:
    """A permutation of a consumer-contiguous sequence: each consumer's samples after the shuffle
    buffer (modelled, see the module docstring) and the sort buffer (exact: chunks of ``sort_size``
    consecutive samples, each sorted by frames, Python's stable sort).

    Long consumers are ordered one at a time (their sorts stay in cache; a sort buffer's chunks are
    the rows of a matrix, sorted row by row, by radix when the frames fit in 16 bits); many short
    ones together, through one sort of a combined key. Both give the same permutation."""
    n = len(frames)
    if n and n >= _CONSUMER_AT_A_TIME * (len(bounds) - 1):
        return _buffered_order_per_consumer(frames, bounds, conf, rng)
    consumer, pos = _positions(bounds)
    perm = np.arange(len(frames), dtype=np.int64)
    if conf.shuffle and len(frames):
        size = conf.shuffle_size
        leave = np.maximum(pos, size - 1) + rng.geometric(1.0 / size, len(frames))
        perm = _stable_order(consumer, leave)
    if conf.sort and len(frames):
        # positions after the shuffle are pos again (the sequence keeps its bounds): chunk c of a
        # consumer is its positions c*sort_size ... (c+1)*sort_size - 1, numbered across consumers
        chunks = -(-np.diff(bounds) // conf.sort_size)
        chunk = (np.concatenate([[0], np.cumsum(chunks)])[:-1])[consumer] + pos // conf.sort_size
        perm = perm[_stable_order(chunk, frames[perm])]
    return perm


# samples per consumer (on average) from which buffered_order takes consumers one at a time
_CONSUMER_AT_A_TIME = 4096


def _buffered_order_per_consumer(frames: np.ndarray, bounds: np.ndarray, conf: TrainerConf,
                                 rng: np.random.Generator) -> np.ndarray:
    """:func:`buffered_order`, consumer by consumer (the shuffle's draws made for all at once, as there)."""
    n = len(frames)
    perm = np.arange(n, dtype=np.int64)
    draws = rng.geometric(1.0 / conf.shuffle_size, n) if conf.shuffle else None
    if draws is not None and int(draws.max()) + conf.shuffle_size + int(np.diff(bounds).max()) < (1 << 31):
        draws = draws.astype(np.int32)  # leaving times fit in 32 bits: the same order, a faster sort
    values = frames
    if conf.sort and int(frames.min()) >= 0 and int(frames.max()) < (1 << 16):
        values = frames.astype(np.uint16)  # the same order, sorted by radix
    for c in range(len(bounds) - 1):
        a, b = int(bounds[c]), int(bounds[c + 1])
        if a == b:
            continue
        local = None
        if draws is not None:
            leave = np.maximum(np.arange(b - a, dtype=draws.dtype), conf.shuffle_size - 1) + draws[a:b]
            local = stable_argsort(leave)
        if conf.sort:
            order = _sort_chunks(values[a:b] if local is None else values[a:b][local], conf.sort_size)
            local = order if local is None else local[order]
        if local is not None:
            perm[a:b] = local + a
    return perm


def _sort_chunks(values: np.ndarray, size: int) -> np.ndarray:
    """The permutation that stably sorts each run of ``size`` consecutive values (the last may be shorter)."""
    length = len(values)
    full = length // size * size
    out = np.empty(length, np.int64)
    if full:
        rows = np.argsort(values[:full].reshape(-1, size), axis=1, kind="stable")
        rows += np.arange(0, full, size)[:, None]
        out[:full] = rows.ravel()
    if full < length:
        out[full:] = np.argsort(values[full:], kind="stable") + full
    return out


def _stable_order(primary: np.ndarray, secondary: np.ndarray) -> np.ndarray:
    """``np.lexsort((secondary, primary))`` (non-negative integers), through one stable sort of a
    combined key when it fits in 62 bits: several times faster on a million samples."""
    if not len(primary):
        return np.zeros(0, np.int64)
    stride = int(secondary.max()) + 1
    if int(primary.max()) * stride + stride < (1 << 62):
        return np.argsort(primary.astype(np.int64) * stride + secondary, kind="stable")
    return np.lexsort((secondary, primary))


# ---------------------------------------------------------------------------------------------
# Batches


def dynamic_batch_starts(frames: np.ndarray, bounds: np.ndarray, max_frames: int, *,
                         precompute: bool | None = None) -> np.ndarray:
    """Where each batch of WeNet's dynamic window starts, per consumer (a bool mark per sample).

    A batch that starts at sample s takes the next samples while (its longest frames) x (its size)
    stays within ``max_frames`` (``DynamicBatchWindow``: before adding a sample the window checks
    ``longest x (buffer + 1)``; a sample that alone exceeds the limit is a batch of one). The
    batches are followed from each consumer's first sample, one batch per step for all consumers
    together. By default each step reads a window of the next samples of every consumer (running
    maxima over a small matrix, widened for the rare batch longer than the window): no per-sample
    table. ``precompute`` True or False takes the older binary lifting over a table of range maxima
    (lengths for every sample beforehand, or per step); all three give the same batches.
    """
    n = len(frames)
    marks = np.zeros(n, bool)
    if n == 0:
        return marks
    bounds = np.asarray(bounds, np.int64)
    cur, end = bounds[:-1].copy(), bounds[1:].copy()
    keep = cur < end
    cur, end = cur[keep], end[keep]
    if precompute is not None:
        return _table_walk(np.asarray(frames, np.int64), bounds, max_frames, cur, end, marks, precompute)
    frames = np.asarray(frames)
    if frames.dtype.kind not in "iu":  # as the table walks read them
        frames = frames.astype(np.int64)
    width = _window_width(frames, bounds, max_frames)
    while len(cur):
        marks[cur] = True
        cur = cur + _window_lengths(frames, cur, end, max_frames, width)
        keep = cur < end
        cur, end = cur[keep], end[keep]
    return marks


def _window_width(frames: np.ndarray, bounds: np.ndarray, max_frames: int) -> int:
    """The window a step reads: a power of two past twice a typical batch (speed only, not the result)."""
    sample = frames[:: max(1, len(frames) // 10001)]
    typical = max_frames // max(1, int(np.median(sample)))
    width = 8
    while width < 2 * typical + 8:
        width *= 2
    return min(width, max(1, _longest_batch(frames, bounds, max_frames)))


def _window_lengths(frames: np.ndarray, cur: np.ndarray, end: np.ndarray, max_frames: int,
                    width: int) -> np.ndarray:
    """The dynamic batch length from each ``cur`` (at least 1), not past ``end``: the samples of a
    window of ``width`` that keep (running maximum) x (size) within ``max_frames`` (a prefix, as both
    factors only grow); a batch that fills its window is measured again in a window twice as wide."""
    got, decided = _window_try(frames, cur, end, max_frames, width)
    todo = np.flatnonzero(~decided)
    while len(todo):
        width *= 2
        rows = max(1, (1 << 22) // width)  # bound the matrix when a window grows wide
        undecided = []
        for r in range(0, len(todo), rows):
            part = todo[r:r + rows]
            got[part], decided = _window_try(frames, cur[part], end[part], max_frames, width)
            undecided.append(part[~decided])
        todo = np.concatenate(undecided)
    return np.maximum(got, 1)


def _window_try(frames: np.ndarray, start: np.ndarray, stop: np.ndarray, max_frames: int,
                width: int) -> tuple[np.ndarray, np.ndarray]:
    """``(samples that fit from each start within a window of width, whether that is the batch's length)``."""
    idx = start[:, None] + np.arange(width)
    peak = np.maximum.accumulate(frames[np.minimum(idx, len(frames) - 1)], axis=1)
    ok = (idx < stop[:, None]) & (peak * np.arange(1, width + 1) <= max_frames)
    got = ok.sum(axis=1)
    return got, (got < width) | (start + width >= stop)


def _table_walk(f: np.ndarray, bounds: np.ndarray, max_frames: int, cur: np.ndarray, end: np.ndarray,
                marks: np.ndarray, precompute: bool) -> np.ndarray:
    """:func:`dynamic_batch_starts` by binary lifting over a table of range maxima: lengths for every
    sample at once (``precompute``) or for the current starts at each step."""
    n = len(f)
    table = _max_table(f, _longest_batch(f, bounds, max_frames))
    following = None
    if precompute:
        consumer = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
        following = np.arange(n, dtype=np.int64) + _batch_lengths(table, np.arange(n, dtype=np.int64),
                                                                  bounds[1:][consumer], max_frames)
    while len(cur):
        marks[cur] = True
        cur = following[cur] if following is not None else cur + _batch_lengths(table, cur, end, max_frames)
        keep = cur < end
        cur, end = cur[keep], end[keep]
    return marks


def _longest_batch(f: np.ndarray, bounds: np.ndarray, max_frames: int) -> int:
    """An upper bound of a dynamic batch's size: a consumer's length, or the limit over the shortest sample."""
    longest = int(np.diff(bounds).max())
    smallest = int(f.min())
    return min(longest, max_frames // smallest + 1) if smallest > 0 else longest


def _max_table(f: np.ndarray, longest: int) -> list[np.ndarray]:
    """``table[k][i] = max(f[i : i + 2**k])`` (clipped at the end), for 2**k up to past ``longest``."""
    levels = max(1, math.ceil(math.log2(longest + 1)))
    table = [f]
    for k in range(1, levels + 1):
        prev, step = table[-1], 1 << (k - 1)
        nxt = prev.copy()
        if step < len(f):
            nxt[:-step] = np.maximum(prev[:-step], prev[step:])
        table.append(nxt)
    return table


def _batch_lengths(table: list[np.ndarray], start: np.ndarray, seg_end: np.ndarray, max_frames: int) -> np.ndarray:
    """The dynamic batch length from each ``start`` (at least 1), not past ``seg_end``: the largest size
    whose (longest frames) x (size) stays within ``max_frames``, found bit by bit from the top."""
    n = len(table[0])
    size = np.zeros(len(start), np.int64)
    best = np.zeros(len(start), np.int64)
    for k in range(len(table) - 1, -1, -1):
        cand = size + (1 << k)
        peak = np.maximum(best, table[k][np.minimum(start + size, n - 1)])
        ok = (start + cand <= seg_end) & (peak * cand <= max_frames)
        size = np.where(ok, cand, size)
        best = np.where(ok, peak, best)
    return np.maximum(size, 1)


def batch_ids(frames: np.ndarray, bounds: np.ndarray, batch: BatchConf) -> np.ndarray:
    """A batch number per sample of the ordered, consumer-contiguous sequence: numbers increase
    along each consumer in the order its batches leave the worker, and never repeat across consumers."""
    consumer, pos = _positions(bounds)
    if batch.batch_type == "static":
        per = -(-np.diff(bounds) // batch.batch_size)
        first = np.concatenate([[0], np.cumsum(per)])[:-1]
        return first[consumer] + pos // batch.batch_size
    if batch.batch_type == "dynamic":
        return np.cumsum(dynamic_batch_starts(frames, bounds, batch.max_frames_in_batch)) - 1
    return _bucket_batch_ids(frames, consumer, pos, batch)


def _bucket_batch_ids(frames, consumer, pos, batch: BatchConf) -> np.ndarray:
    """``bucket_by_sequence_length``: bucket = the first boundary above the frames; a bucket's batch
    leaves when it holds its size, the partial ones at the end of the worker in the order their
    buckets were opened. (torch's ``Grouper`` also empties its biggest bucket when 10000 samples wait,
    which these batch sizes never reach.)"""
    n = len(frames)
    if n == 0:
        return np.zeros(0, np.int64)
    sizes = np.asarray(batch.bucket_batch_sizes, np.int64)
    bucket = np.searchsorted(np.asarray(batch.bucket_boundaries, np.int64), frames, side="right")
    group = consumer.astype(np.int64) * len(sizes) + bucket
    order = np.lexsort((pos, group))
    g_sorted = group[order]
    first_of_group = np.concatenate([[True], g_sorted[1:] != g_sorted[:-1]])
    group_start = np.flatnonzero(first_of_group)
    rank_in_group = np.arange(n) - np.repeat(group_start, np.diff(np.append(group_start, n)))
    size = sizes[g_sorted % len(sizes)]
    count = np.repeat(np.diff(np.append(group_start, n)), np.diff(np.append(group_start, n)))
    nth = rank_in_group // size
    full = (nth + 1) * size <= count
    # when the batch leaves: the position of its last sample if full, else after the worker's last
    # sample, in the order of its first sample
    last_pos = np.where(full, pos[order][np.minimum(np.arange(n) - rank_in_group % size + size - 1, n - 1)], 0)
    first_pos = pos[order][np.arange(n) - rank_in_group % size]
    leave = np.where(full, last_pos, (1 << 40) + first_pos)
    _, inverse = np.unique(consumer[order].astype(np.int64) * (1 << 42) + leave, return_inverse=True)
    ids = np.empty(n, np.int64)
    ids[order] = inverse.ravel()
    return ids


@dataclass
class EpochBatches:
    """One epoch's batches: per (rank, worker) counts, per rank steps and what equal_steps leaves out."""

    epoch: int
    worker_batches: np.ndarray  # [world_size, num_workers]
    rank_steps: np.ndarray  # [world_size]
    left_out_batches: np.ndarray  # [world_size]
    left_out_seconds: np.ndarray  # [world_size]
    rank_seconds: np.ndarray  # [world_size]

    def summary(self) -> dict:
        steps = self.rank_steps
        return {"epoch": self.epoch, "steps_per_rank": steps.tolist(),
                "batches_per_worker": self.worker_batches.tolist(),
                "steps_min": int(steps.min()), "steps_max": int(steps.max()),
                "steps_spread": int(steps.max() - steps.min()),
                "equal_steps_left_out": {"batches": self.left_out_batches.tolist(),
                                         "seconds": [round(float(s), 3) for s in self.left_out_seconds],
                                         "share_of_seconds": round(float(self.left_out_seconds.sum())
                                                                   / max(float(self.rank_seconds.sum()), 1e-12), 6)}}


# utterances of consumers simulated together (their order's temporaries): ~2 M, a few hundred MB
BLOCK_UTTERANCES = 1 << 21


def simulate_epoch(shard_offsets, frames, seconds, *, world_size: int, num_workers: int, conf: TrainerConf,
                   seed: int, epoch: int, block_utterances: int = BLOCK_UTTERANCES) -> EpochBatches:
    """Batches of every (rank, worker) in one epoch of the list whose shards hold the given utterances.

    ``shard_offsets``: CSR offsets of each list line's utterances (in shard order) into ``frames``
    (feature frames, after the filter; any integer dtype, kept) and ``seconds`` (audio seconds, for
    what is left out).

    Consumers are taken in blocks of about ``block_utterances`` utterances, in consumer order (each
    consumer's samples, shuffle and batches are its own; the shuffle's draws come from one generator
    in that order, as for the whole sequence at once): only the ordered frames and utterance ids of
    the whole epoch are held, in the frames' dtype and int32. Dynamic batches are then followed for
    all consumers together; the tallies (batch seconds, rank seconds) add in the same order as one
    pass over the whole sequence would, so the result is the same to the last bit.
    """
    shard_offsets = np.asarray(shard_offsets, np.int64)
    frames = np.asarray(frames)
    if frames.dtype.kind not in "iu":
        frames = frames.astype(np.int64)
    seconds = np.asarray(seconds, np.float64)
    consumers = world_size * num_workers
    n_shards = len(shard_offsets) - 1
    order = shuffled_order(n_shards, seed, epoch) if conf.list_shuffle else np.arange(n_shards)
    order = np.tile(order, conf.cycle)
    seq, seq_bounds, utt_bounds = _consumer_shards(shard_offsets, order, consumers)
    blocks = _consumer_blocks(utt_bounds, block_utterances)
    rng = np.random.default_rng([seed, epoch, 1])
    total = int(utt_bounds[-1])
    ordered_frames = np.empty(total, frames.dtype)
    ordered_utts = np.empty(total, np.int32 if len(frames) < (1 << 31) else np.int64)
    for a, b in blocks:
        utts = _shard_utterances(shard_offsets, seq[seq_bounds[a]:seq_bounds[b]])
        f = frames[utts]
        perm = buffered_order(f, utt_bounds[a:b + 1] - utt_bounds[a], conf, rng)
        ordered_frames[utt_bounds[a]:utt_bounds[b]] = f[perm]
        ordered_utts[utt_bounds[a]:utt_bounds[b]] = utts[perm]
        del utts, f, perm
    dynamic = conf.batch.batch_type == "dynamic"
    marks = dynamic_batch_starts(ordered_frames, utt_bounds, conf.batch.max_frames_in_batch) if dynamic else None
    tally = _Tally(consumers, world_size)
    for a, b in blocks:
        lo, hi = int(utt_bounds[a]), int(utt_bounds[b])
        bounds = utt_bounds[a:b + 1] - lo
        ids = np.cumsum(marks[lo:hi]) - 1 if dynamic else batch_ids(ordered_frames[lo:hi], bounds, conf.batch)
        tally.add(a, bounds, ids, seconds[ordered_utts[lo:hi]])
    return tally.epoch(epoch, num_workers)


def _consumer_shards(shard_offsets: np.ndarray, order: np.ndarray, consumers: int):
    """``(shards in reading order, start of each consumer in it, start of each consumer's utterances)``;
    position p of the list goes to consumer ``p mod consumers`` (see :func:`consumer_utterances`)."""
    positions = np.arange(len(order))
    seq = order[np.argsort(positions % consumers, kind="stable")]
    lengths = (shard_offsets[1:] - shard_offsets[:-1])[seq]
    seq_bounds = np.concatenate([[0], np.cumsum(np.bincount(positions % consumers, minlength=consumers))])
    utt_bounds = np.concatenate([[0], np.cumsum(lengths)])[seq_bounds]
    return seq, seq_bounds, utt_bounds.astype(np.int64)


def _shard_utterances(shard_offsets: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The utterance ids of the shards ``seq``, in order (a vectorised concatenation of ranges)."""
    lengths = (shard_offsets[1:] - shard_offsets[:-1])[seq]
    ends_before = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum()), dtype=np.int64) + np.repeat(shard_offsets[:-1][seq] - ends_before, lengths)


def _consumer_blocks(utt_bounds: np.ndarray, block_utterances: int) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of consumers, each of at least one consumer and, past its first, at most
    ``block_utterances`` utterances."""
    blocks, a = [], 0
    consumers = len(utt_bounds) - 1
    for c in range(1, consumers + 1):
        if c == consumers or utt_bounds[c + 1] - utt_bounds[a] > block_utterances:
            blocks.append((a, c))
            a = c
    return blocks


class _Tally:
    """One epoch's batches, block by block of consumers (in consumer order): which consumer each batch
    belongs to, its seconds, and the seconds per rank, summed in the order of the whole sequence."""

    def __init__(self, consumers: int, world_size: int):
        self.consumers, self.world_size = consumers, world_size
        self.batch_consumer: list[np.ndarray] = []
        self.batch_seconds: list[np.ndarray] = []
        self.rank_seconds = np.zeros(world_size)

    def add(self, first_consumer: int, bounds: np.ndarray, ids: np.ndarray, secs: np.ndarray) -> None:
        """A block's samples: their local batch numbers (from 0) and seconds, in batch order."""
        n_batches = int(ids.max()) + 1 if len(ids) else 0
        sizes = np.diff(bounds)
        consumers = np.arange(first_consumer, first_consumer + len(sizes))
        batch_consumer = np.zeros(n_batches, np.int64)
        batch_consumer[ids] = np.repeat(consumers, sizes)
        self.batch_consumer.append(batch_consumer)
        self.batch_seconds.append(np.bincount(ids, weights=secs, minlength=n_batches))
        # each rank's running sum goes first: bincount adds in element order, from 0.0 + the sum so far
        w = self.world_size
        self.rank_seconds = np.bincount(np.concatenate([np.arange(w), np.repeat(consumers % w, sizes)]),
                                        weights=np.concatenate([self.rank_seconds, secs]), minlength=w)

    def epoch(self, epoch: int, num_workers: int) -> EpochBatches:
        world_size = self.world_size
        batch_consumer = np.concatenate(self.batch_consumer) if self.batch_consumer else np.zeros(0, np.int64)
        batch_seconds = np.concatenate(self.batch_seconds) if self.batch_seconds else np.zeros(0)
        n_batches = len(batch_consumer)
        per_consumer = (np.bincount(batch_consumer, minlength=self.consumers) if n_batches
                        else np.zeros(self.consumers, np.int64))
        # a consumer's batch j (in leaving order) is its j-th; consumer = worker * world_size + rank
        first = np.concatenate([[0], np.cumsum(per_consumer)])[:-1]
        nth = np.arange(n_batches) - first[batch_consumer]
        worker_batches = per_consumer.reshape(num_workers, world_size).T
        rank_steps = worker_batches.sum(axis=1)
        left_b, left_s = _left_out(batch_consumer, nth, batch_seconds, rank_steps, world_size)
        return EpochBatches(epoch, worker_batches, rank_steps, left_b, left_s, self.rank_seconds)


def _left_out(batch_consumer, nth, batch_seconds, rank_steps, world_size: int):
    """Per rank, the batches and seconds past the smallest rank's step count, in the loader's order
    (round robin over the workers: batch j of worker w is stepped at (j, w))."""
    surplus = rank_steps - (rank_steps.min() if len(rank_steps) else 0)
    seconds = np.zeros(world_size)
    if len(batch_consumer):
        rank = batch_consumer % world_size
        worker = batch_consumer // world_size
        loader_order = np.lexsort((worker, nth, rank))  # per rank, in stepping order
        sorted_rank = rank[loader_order]
        starts = np.searchsorted(sorted_rank, np.arange(world_size))
        for r in np.flatnonzero(surplus):
            end = starts[r] + rank_steps[r]
            seconds[r] = batch_seconds[loader_order[end - surplus[r]:end]].sum()
    return surplus, seconds


def plan_batches(shard_offsets, samples, sample_rate, seconds, *, world_size: int, num_workers: int,
                 conf: TrainerConf, seed: int = 0, epochs: int = 1) -> dict:
    """Steps per rank and worker for each epoch, JSON-ready (see :func:`simulate_epoch`).

    ``samples``/``sample_rate``/``seconds`` are per utterance (the filter's survivors), in the CSR
    layout of ``shard_offsets``. Feature frames are drawn again each epoch when they are random
    (speed perturbation, spec_trim).
    """
    random_frames = conf.speed_perturb or conf.spec_trim
    frames = None
    per_epoch = []
    for epoch in range(epochs):
        if frames is None or random_frames:
            frames = None  # the last epoch's frames go before the next are drawn
            frames = feature_frames(samples, sample_rate, conf, seed_seq=(seed, epoch, 2), dtype=np.int32)
            if len(frames) and int(frames.min()) >= 0 and int(frames.max()) < (1 << 16):
                frames = frames.astype(np.uint16)  # up to 655 s an utterance: half the memory, radix sorts
        per_epoch.append(simulate_epoch(shard_offsets, frames, seconds, world_size=world_size,
                                        num_workers=num_workers, conf=conf, seed=seed, epoch=epoch).summary())
    b = conf.batch
    batching = {"batch_type": b.batch_type}
    if b.batch_type == "static":
        batching["batch_size"] = b.batch_size
    elif b.batch_type == "dynamic":
        batching["max_frames_in_batch"] = b.max_frames_in_batch
    else:
        batching.update(bucket_boundaries=list(b.bucket_boundaries), bucket_batch_sizes=list(b.bucket_batch_sizes))
    return {"batching": batching, "shuffle_size": conf.shuffle_size if conf.shuffle else None,
            "sort_size": conf.sort_size if conf.sort else None, "world_size": world_size, "num_workers": num_workers,
            "seed": seed, "order_model": ORDER_MODEL, "epochs": per_epoch,
            "worst_steps_spread": max((e["steps_spread"] for e in per_epoch), default=0)}


ORDER_MODEL = ("list shuffle: numpy's permutation for (seed, epoch); shuffle buffer: each sample leaves after a "
               "geometric wait of mean shuffle_size (one draw per epoch); sort buffer and batching: exact")


def filter_summary(reasons: np.ndarray, corpus: np.ndarray, names: Sequence[str], seconds: np.ndarray,
                   keys: Sequence[str], *, examples: int = 5) -> dict:
    """What the filter drops, JSON-ready: totals, and per corpus utterances, seconds, their share of
    the corpus, the count per reason and the first ``examples`` dropped keys."""
    dropped = reasons != 0
    per_corpus = []
    for c, name in enumerate(names):
        mine = corpus == c
        gone = mine & dropped
        total_s = float(seconds[mine].sum())
        gone_s = float(seconds[gone].sum())
        counts = np.bincount(reasons[gone], minlength=len(REASONS))
        per_corpus.append({
            "corpus": name, "utterances": int(mine.sum()), "seconds": round(total_s, 3),
            "dropped_utterances": int(gone.sum()), "dropped_seconds": round(gone_s, 3),
            "dropped_share": round(gone_s / total_s, 6) if total_s > 0 else 0.0,
            "reasons": {REASONS[r]: int(counts[r]) for r in range(1, len(REASONS)) if counts[r]},
            "example_keys": [keys[i] for i in np.flatnonzero(gone)[:examples]]})
    total_s = float(seconds.sum())
    gone_s = float(seconds[dropped].sum())
    return {"utterances": len(reasons), "dropped_utterances": int(dropped.sum()),
            "dropped_seconds": round(gone_s, 3), "dropped_share": round(gone_s / total_s, 6) if total_s > 0 else 0.0,
            "corpora": per_corpus}
