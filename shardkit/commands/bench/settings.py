"""What a bench run is asked to measure (:class:`BenchSettings`), the checks that refuse what it could
not measure before anything is written, and the error a run raises when a figure would be a lie."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.codecs import parse_codec_spec
from shardkit.run.events import Events

DEFAULT_FORMATS = ("none", "gz", "bz2", "xz", "zst:1", "zst:3", "zst:19")
MP_CONTEXTS = ("fork", "spawn", "forkserver")
AUDIO_CODECS = ("wav", "flac")


class BenchCheckError(ShardkitError):
    """A measured run did not read or decode the whole corpus: its figure would be a lie."""

    check = "bench"


@dataclass(frozen=True)
class BenchSettings:
    """What to measure and against what GPU side. How many processes build the corpus is the run's
    ``RunOptions.jobs``, not a setting."""

    formats: tuple[str, ...] = DEFAULT_FORMATS
    audio: tuple[str, ...] = AUDIO_CODECS
    decoders: tuple[str, ...] = ("shardkit", "soundfile")
    reference: tuple[str, ...] = ("bz2",)  # formats that get the WeNet-style reference row
    workers: tuple[int, ...] = (0, 1, 2, 4)
    mp_contexts: tuple[str, ...] = MP_CONTEXTS
    loader_format: str = "zst:3"
    loader_batch_size: int = 16
    min_seconds: float = 0.5
    repeat: int = 3
    corpus_mb: float = 32.0
    max_bytes: int = 100_000_000
    write_sample_mb: float = 4.0
    gpus_per_node: int | None = None  # None: the GPUs seen here (gpus_seen), else 1, said to be a guess
    target_hours_per_second: float = 0.42
    fbank_hours_per_second_per_core: float = 0.25
    seed: int = 0
    webdataset: bool = True  # WebDataset loader rows (when webdataset is installed)

    @property
    def needs_torchaudio(self) -> bool:
        """Whether a row decodes with torchaudio: its decoder, or a WeNet reference row among the formats."""
        return "torchaudio" in self.decoders or bool(set(self.reference) & set(self.formats))

    def to_json(self, jobs: int | None) -> dict:
        """The settings as bench.json records them, with the run's ``jobs`` among them (before ``webdataset``,
        where the report has always had it)."""
        fields = asdict(self)
        webdataset = fields.pop("webdataset")
        return {**fields, "jobs": jobs, "webdataset": webdataset}


def parse_list(text: str, what: str) -> tuple[str, ...]:
    """The comma-separated values of option ``what``, stripped; UsageError when there is none."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise UsageError(f"{what}: give at least one value")
    return items


def check_settings(s: BenchSettings) -> None:
    """UsageError for anything the run could not measure; pure."""
    _check_formats(s)
    _check_choices(s)
    _check_numbers(s)


def _check_formats(s: BenchSettings) -> None:
    for spec in s.formats + s.reference + (s.loader_format,):
        parse_codec_spec(spec)
    # a reference format not among --formats is simply not measured
    if any(parse_codec_spec(spec)[0] == "zst" for spec in s.reference):
        raise UsageError("the WeNet reference row needs a format tarfile reads (none, gz, bz2, xz), not zst")


def _refuse_unknown(values: tuple[str, ...], allowed, message: str) -> None:
    """UsageError ``message`` (``{!r}``: the value) for the first of ``values`` not in ``allowed``."""
    for value in values:
        if value not in allowed:
            raise UsageError(message.format(value))


def _check_choices(s: BenchSettings) -> None:
    from shardkit.training.reader import DECODERS

    _refuse_unknown(s.audio, AUDIO_CODECS, "unknown audio codec {!r}; choose from wav, flac")
    _refuse_unknown(s.decoders, DECODERS, "unknown decoder {!r}; choose from " + ", ".join(DECODERS))
    if any(w < 0 for w in s.workers):
        raise UsageError("--workers values must be >= 0")
    _refuse_unknown(s.mp_contexts, MP_CONTEXTS,
                    "unknown multiprocessing context {!r}; choose from " + ", ".join(MP_CONTEXTS))


def _check_numbers(s: BenchSettings) -> None:
    if s.repeat < 1 or s.min_seconds < 0:
        raise UsageError("--repeat must be >= 1 and --min-seconds >= 0")
    gpus_bad = s.gpus_per_node is not None and s.gpus_per_node < 1
    if s.corpus_mb <= 0 or s.max_bytes <= 0 or gpus_bad or s.target_hours_per_second <= 0:
        raise UsageError("--corpus-mb, --max-bytes, --gpus-per-node and --target-hours-per-second must be > 0")


def say(events: Events, text: str) -> None:
    """A progress line of the run, as the command line has always printed it ("bench: ...")."""
    events.note(f"bench: {text}")
