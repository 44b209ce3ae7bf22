"""WeNet's training conf as numbers: what of ``dataset_conf`` and the tokenizer entries decides which
utterances train and how they batch (pure: a parsed mapping in, a :class:`TrainerConf` out).

:mod:`shardkit.wenet_conf.load` reads the YAML and hands the mapping here. Every key of
``dataset_conf`` is used, known to change no count, or named in a warning; a value WeNet would
reject is a :class:`ConfError` naming the key. Defaults are WeNet's own (``wenet/dataset/dataset.py``
and ``processor.py``, read at 01546996, see docs/reference/wenet-format.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping


class ConfError(ValueError):
    """A value of the conf that WeNet would reject or that cannot be planned (the reader names the file)."""


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
    problems = _batch_problems(conf.batch) + _loader_problems(conf)
    if problems:
        raise ConfError(f"{source}: dataset_conf." + "; ".join(problems))


def _batch_problems(b: BatchConf) -> list[str]:
    """What of ``batch_conf`` makes no batches (the checks of its batch type only)."""
    if b.batch_type == "static":
        return [f"batch_conf.batch_size must be >= 1 (got {b.batch_size})"] if b.batch_size < 1 else []
    if b.batch_type == "dynamic":
        return ([f"batch_conf.max_frames_in_batch must be >= 1 (got {b.max_frames_in_batch})"]
                if b.max_frames_in_batch < 1 else [])
    if b.batch_type != "bucket":
        return []
    problems = []
    if len(b.bucket_batch_sizes) != len(b.bucket_boundaries) + 1:
        problems.append("batch_conf.bucket_batch_sizes needs one more entry than bucket_boundaries "
                        f"(got {len(b.bucket_batch_sizes)} and {len(b.bucket_boundaries)})")
    if any(s < 1 for s in b.bucket_batch_sizes):
        problems.append("batch_conf.bucket_batch_sizes must all be >= 1")
    return problems


def _loader_problems(conf: TrainerConf) -> list[str]:
    """What of the buffers, the cycle, the resampling and the speeds WeNet would reject, in the conf's order."""
    checks = (
        (conf.shuffle and conf.shuffle_size < 1, f"shuffle_conf.shuffle_size must be >= 1 (got {conf.shuffle_size})"),
        (conf.sort and conf.sort_size < 1, f"sort_conf.sort_size must be >= 1 (got {conf.sort_size})"),
        (conf.cycle < 1, f"cycle must be >= 1 (got {conf.cycle})"),
        (conf.resample_rate < 1, f"resample_conf.resample_rate must be >= 1 (got {conf.resample_rate})"),
        (conf.speed_perturb and (not conf.speeds or any(s <= 0 for s in conf.speeds)),
         "speed_perturb speeds must be > 0"),
    )
    return [problem for failed, problem in checks if failed]
