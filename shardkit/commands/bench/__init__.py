"""bench: what each shard format and loader setting costs on this machine, and what to pick.

One run measures, on the same utterances re-packed into every format (``none``, ``gz``, ``bz2``,
``xz``, ``zst:L``) for every audio codec (WAV, FLAC members):

- size relative to the plain WAV tar;
- writing the format from the plain WAV tar (compression, plus FLAC transcoding as convert does);
- decompression alone; read + group (no decode); read + decode per decoder (shardkit's reader);
- a reference row the way WeNet reads: ``tarfile`` ``r:*`` + ``torchaudio.load(io.BytesIO(...))``;
- a real torch ``DataLoader`` over ``ShardDataset`` for each worker count and start method.

Every measurement repeats until both ``repeat`` runs and ``min_seconds`` are reached and keeps the
median and spread; every run must read every utterance and decode every frame, or the bench
fails (a reader that decodes nothing must not report a big number). The recommendation is
computed from the figures by pure functions (``shardkit.planning.bench.recommend``), with the GPU
side's consumption and fbank cost as inputs (assumed, docs/performance.md: an H100 takes ~0.42 h/s at WeNet's
default batches; fbank costs ~0.25 h/s per core).

The package, in the order a run goes: ``settings`` (what to measure, its checks), ``corpus`` (the
utterances in every format), ``timing`` (repeat, check, median), ``formats``, ``loader`` and
``webdataset`` (the three kinds of rows), ``report`` (bench.md) and ``plot`` (bench.png); this module
runs them (:func:`run_bench`) and describes the machine.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field

from shardkit import __version__
from shardkit.commands.bench.corpus import base_shards, build_formats, generate_corpus, plan_corpus, sample_corpus
from shardkit.commands.bench.formats import (
    FormatRows,
    measure_formats,
    read_decode,
    warm_up_torchaudio,
    wenet_reference,
    write_sample,
)
from shardkit.commands.bench.loader import loader_rows, measure_loader
from shardkit.commands.bench.report import format_tables, loader_panel_note, recommendation_text
from shardkit.commands.bench.settings import (
    DEFAULT_FORMATS,
    MP_CONTEXTS,
    BenchCheckError,
    BenchSettings,
    check_settings,
    parse_list,
    say,
)
from shardkit.commands.bench.timing import rates, timed
from shardkit.commands.bench.webdataset import WDS_LOADERS, measure_webdataset, webdataset_read
from shardkit.errors import UsageError
from shardkit.planning.advice import workers_needed
from shardkit.planning.bench import LOADER_DTYPE, recommend, webdataset_recommendation
from shardkit.run.options import RunOptions

__all__ = [
    "DEFAULT_FORMATS", "LOADER_DTYPE", "MP_CONTEXTS", "WDS_LOADERS", "BenchCheckError", "BenchReport",
    "BenchSettings", "build_formats", "check_settings", "format_tables", "generate_corpus", "gpus_for_advice",
    "gpus_seen", "loader_panel_note", "machine_info", "measure_bench", "measure_loader", "parse_list",
    "plan_corpus", "rates", "read_decode", "recommend", "recommendation_text", "run_bench", "timed",
    "webdataset_read", "wenet_reference", "workers_needed", "write_outputs",
]


# ---------------------------------------------------------------------------------------------
# The machine


def machine_info() -> dict:
    """The machine a bench ran on (CPU, cores, memory, Python and library versions), for bench.md and bench.json."""
    import numpy
    import soundfile
    import zstandard

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {"shardkit": __version__, "numpy": numpy.__version__, "soundfile": soundfile.__version__,
                "libsndfile": soundfile.__libsndfile_version__, "zstandard": zstandard.__version__}
    for name in ("torch", "torchaudio", "indexed_bzip2", "isal", "matplotlib"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "?")
        except ImportError:
            versions[name] = None
    from shardkit.run.executor import usable_cores

    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable_cores(), "python": platform.python_version(),
            "platform": platform.platform(), "libraries": versions}


def gpus_seen() -> tuple[int, str]:
    """(GPUs on this machine, how that was found): torch's count where torch is installed, else the
    NVIDIA driver's per-GPU folders; 0 when neither sees one."""
    import glob
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        try:
            import torch

            return torch.cuda.device_count(), "torch.cuda.device_count()"
        except Exception as err:  # a broken CUDA install: say so, count none
            return 0, f"torch could not count GPUs ({type(err).__name__})"
    return len(glob.glob("/proc/driver/nvidia/gpus/*")), "/proc/driver/nvidia/gpus (torch is not installed)"


def gpus_for_advice(given: int | None) -> tuple[int, str, bool]:
    """(GPUs per node to advise for, where the number comes from, whether it is a guess)."""
    if given is not None:
        return given, "--gpus-per-node", False
    seen, how = gpus_seen()
    if seen:
        return seen, f"the GPUs seen here ({how})", False
    return 1, (f"a guess: no GPU seen here ({how}), so 1 per node; give --gpus-per-node N for the training "
               f"nodes"), True


# ---------------------------------------------------------------------------------------------
# The run


@dataclass
class BenchReport:
    """Everything a run measured and recommends (``to_json``: bench.json), and where its outputs went."""

    machine: dict
    settings: dict
    corpus: dict
    formats: list[dict] = field(default_factory=list)
    loader: list[dict] = field(default_factory=list)
    recommendation: dict = field(default_factory=dict)
    seconds: float = 0.0
    webdataset: list[dict] = field(default_factory=list)
    outputs: dict | None = None  # {json, md, png}: the files run_bench wrote (png None without matplotlib)

    def to_json(self) -> dict:
        """bench.json: the machine, settings, corpus, every table's rows, the recommendation and the time taken."""
        return {"tool": "shardkit", "version": __version__, "command": "bench", "machine": self.machine,
                "settings": self.settings, "corpus": self.corpus, "formats": self.formats, "loader": self.loader,
                "webdataset": self.webdataset, "recommendation": self.recommendation,
                "seconds": round(self.seconds, 2)}

    def summary(self) -> dict:
        """What ``--json`` prints: bench.json's fields and the ``outputs`` written."""
        return {**self.to_json(), "outputs": self.outputs}


def run_bench(shard_args: list[str], out_dir: str, settings: BenchSettings, options: RunOptions | None = None,
              *, work_dir: str | None = None) -> BenchReport:
    """:func:`measure_bench`, then OUT_DIR/bench.json, bench.md and bench.png (``report.outputs``).

    ``options``: ``jobs`` (processes that build the corpus [None: every core]; the measurements run one
    core at a time) and progress (a ``note`` event per measurement, "bench: ...").
    """
    report = measure_bench(shard_args, settings, options, work_dir=work_dir)
    report.outputs = write_outputs(report, out_dir)
    return report


def measure_bench(shard_args: list[str], settings: BenchSettings, options: RunOptions | None = None,
                  *, work_dir: str | None = None) -> BenchReport:
    """Build the corpus in every format (under ``work_dir``, removed after), measure everything, recommend.

    SHARDS in ``shard_args`` are sampled (up to ``max_bytes``); without any the corpus is generated.
    """
    from shardkit.training.reader import reuse_freed_memory

    options = options or RunOptions()
    check_settings(settings)
    if settings.needs_torchaudio:
        _require_torchaudio()
    started = time.perf_counter()
    # as in the loader workers (ShardDataset does the same there): see reuse_freed_memory
    tuned = reuse_freed_memory()
    work = tempfile.mkdtemp(prefix="shardkit-bench-", dir=work_dir)
    try:
        report = _measure(shard_args, work, settings, options)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.machine["malloc_tuned"] = tuned
    report.seconds = time.perf_counter() - started
    return report


def _require_torchaudio() -> None:
    try:
        import torchaudio  # noqa: F401
    except ImportError:
        raise UsageError("the torchaudio decoder and the WeNet reference row need torchaudio "
                         "(pip install 'shardkit[torch]'), or pass --reference ''") from None


def _measure(shard_args: list[str], work: str, settings: BenchSettings, options: RunOptions) -> BenchReport:
    events = options.events
    jobs = options.jobs or os.cpu_count() or 1
    say(events, "corpus")
    corpus = sample_corpus(shard_args, work, settings) if shard_args else generate_corpus(work, settings, jobs)
    say(events, f"corpus: {corpus['utterances']} utterances, {corpus['hours']:.2f} h, "
                f"{corpus['wav_tar_bytes'] / 1e6:.1f} MB of WAV tar; writing {len(settings.formats)} formats")
    layout = build_formats(work, settings, jobs)
    sample_tar = write_sample(base_shards(work, "wav")[0], int(settings.write_sample_mb * 1e6))
    if settings.needs_torchaudio:
        warm_up_torchaudio(work, settings.audio)
    report = BenchReport(machine=machine_info(), settings=settings.to_json(options.jobs), corpus=corpus)
    corpus["plain_tar_bytes"] = {a: sum(os.path.getsize(p) for p in base_shards(work, a)) for a in settings.audio}
    report.formats = measure_formats(layout, FormatRows(corpus, sample_tar, settings, events))
    report.loader = loader_rows(layout, corpus, settings, events)
    report.recommendation = _recommend(report, settings)
    if settings.webdataset:
        report.webdataset = measure_webdataset(layout, corpus, settings, events)
        if report.webdataset:
            report.recommendation["webdataset"] = webdataset_recommendation(report.webdataset)
    return report


def _recommend(report: BenchReport, settings: BenchSettings) -> dict:
    gpus, gpus_from, guessed = gpus_for_advice(settings.gpus_per_node)
    return recommend(report.formats, report.loader, cores=report.machine["usable_cores"], gpus_per_node=gpus,
                     gpus_from=gpus_from, guessed=guessed, target_hps=settings.target_hours_per_second,
                     fbank_hps=settings.fbank_hours_per_second_per_core)


def write_outputs(report: BenchReport, out_dir: str) -> dict:
    """OUT_DIR/bench.json, bench.md and bench.png (each written atomically); returns their paths (png
    None without matplotlib, the bench extra)."""
    from shardkit.commands.bench.plot import plot
    from shardkit.io.files import atomic_write_json
    from shardkit.io.files import atomic_write_bytes
    from shardkit.run.lifecycle import prepare_out_dir

    out_dir = prepare_out_dir(out_dir)
    data = report.to_json()
    paths = {"json": os.path.join(out_dir, "bench.json"), "md": os.path.join(out_dir, "bench.md"),
             "png": os.path.join(out_dir, "bench.png")}
    atomic_write_json(paths["json"], data)
    atomic_write_bytes(paths["md"], format_tables(data).encode("utf-8"))
    try:
        atomic_write_bytes(paths["png"], plot(data))
    except ImportError:
        paths["png"] = None  # matplotlib is the bench extra
    return paths
