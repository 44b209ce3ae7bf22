"""What validate checks for: :class:`ValidateOptions` (the expected audio, the limits, the backend),
and the refusal of choices that contradict each other before any shard is read."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from shardkit.errors import UsageError
from shardkit.io.tar import DEFAULT_MAX_MEMBER_BYTES
from shardkit.planning.threads import decompressor_threads

BACKENDS = ("soundfile", "torchaudio")


@dataclass(frozen=True)
class ValidateOptions:
    """What ``validate`` checks: the decoder backend, the expected sample rate and channels, the
    duration bounds, the member size bound, decompressor threads, the longest member it decodes, and
    whether a corpus mixing formats is a finding (``strict``).
    """
    backend: str = "soundfile"
    sample_rate: int | None = None
    channels: int | None = None
    min_duration: float | None = None
    max_duration: float | None = None
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    # decompressor threads per task (bz2, gz); None: chosen by run_validate from the cores and the run's jobs
    # (planning.threads.decompressor_threads), and the report names the number chosen
    threads: int | None = 1
    # longer members are a finding, not decoded; None: no limit for the soundfile backend (it decodes in blocks),
    # DEFAULT_MAX_DECODED_SECONDS for torchaudio (it decodes a member whole)
    max_decoded_seconds: float | None = None
    strict: bool = False  # more than one sample rate, channel count or audio format is a finding, not a warning

    def with_threads(self, jobs: int | None, executor: str) -> ValidateOptions:
        """These options with ``threads`` chosen for ``jobs`` tasks on ``executor`` when it is None."""
        if self.threads is not None:
            return self
        return dataclasses.replace(self, threads=decompressor_threads(os.cpu_count() or 1, jobs, executor))


def check_options(options: ValidateOptions) -> None:
    """Refuse contradictory options, and the torchaudio backend without torchaudio (UsageError)."""
    if options.backend not in BACKENDS:
        raise UsageError(f"unknown backend {options.backend!r}; choose from {', '.join(BACKENDS)}")
    if options.min_duration is not None and options.max_duration is not None \
            and options.min_duration > options.max_duration:
        raise UsageError(f"--min-duration {options.min_duration} is above --max-duration {options.max_duration}")
    if options.backend == "torchaudio":
        try:
            import torchaudio  # noqa: F401
        except ImportError:
            raise UsageError("--backend torchaudio needs torchaudio, which is not installed: "
                             "pip install 'shardkit[torch]'") from None
