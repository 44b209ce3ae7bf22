"""make: speech data (a Kaldi data directory, a WeNet raw list, NeMo or Lhotse manifests, Parquet,
WebDataset tars) into WeNet-style shards.

Two source sides share one write side. A Kaldi directory (``from_kaldi.run_make``): ``pairing``
pairs transcripts with audio and lists what cannot be paired (pure), recordings' headers are probed
for durations. Any other source (``manifests.run_make_from``): entries stream into a columnar
``catalog``, are probed and checked. Both cut their utterances, in order, into shards of about equal
seconds or of a fixed count (``shardkit.planning.shard_cuts``, pure), and ``write.write_shards`` writes
them like ``convert``: through ``lifecycle`` (output claimed and locked, every file written atomically
and verified, a journal to resume from) and the executor (inline, a local pool or Ray; ``--split I/N``
writes slice I of the planned shards, joined by ``shardkit merge-reports --command make``), one shard
per task (``shard.make_shard``, whose utterances' audio comes from ``audio``); OUT_DIR may be a URL.
``report`` holds ``MakeReport`` and the slice join; ``source`` settles what the command line names.

Each run takes its execution choices whole, as one ``shardkit.run.options.RunOptions``, and reports
progress through its events. This package re-exports the names other code imports from it.
"""

from __future__ import annotations

from shardkit.commands.make.audio import to_int16, utterance_audio
from shardkit.commands.make.from_kaldi import (
    load_data_dir,
    probe_recording,
    probe_recordings,
    refuse_pipes,
    run_make,
)
from shardkit.commands.make.manifests import run_make_from
from shardkit.commands.make.pairing import (
    MAX_SEGMENT_OVERSHOOT,
    attach_durations,
    check_key,
    map_member_keys,
    match_utterances,
)
from shardkit.commands.make.report import MakeReport, merge_reports, merge_slice_reports
from shardkit.commands.make.settings import (
    AUDIO_FORMATS,
    DEFAULT_SHARD_SECONDS,
    HEADER_FINDINGS,
    JOURNAL,
    MANIFEST,
    MakeSettings,
    check_settings,
    finding,
    shard_fingerprint,
)
from shardkit.commands.make.shard import READ_AHEAD_BYTES, make_shard, read_ahead
from shardkit.commands.make.source import MakeSource, check_field_options, resolve_source, run_make_source
from shardkit.commands.make.write import PlannedShards, claimed_run, write_shards
from shardkit.commands.make.write import _plan_writes as _plan_writes  # the steps' tests import these two
from shardkit.commands.make.write import _split_done as _split_done
from shardkit.planning.shard_cuts import plan_cuts, plan_shards

__all__ = [
    "AUDIO_FORMATS", "DEFAULT_SHARD_SECONDS", "HEADER_FINDINGS", "JOURNAL", "MANIFEST", "MAX_SEGMENT_OVERSHOOT",
    "READ_AHEAD_BYTES", "MakeReport", "MakeSettings", "MakeSource", "PlannedShards", "attach_durations",
    "check_field_options", "check_key", "check_settings", "claimed_run", "finding", "load_data_dir",
    "make_shard", "map_member_keys", "match_utterances", "merge_reports", "merge_slice_reports", "plan_cuts",
    "plan_shards", "probe_recording", "probe_recordings", "read_ahead", "refuse_pipes", "resolve_source",
    "run_make", "run_make_from", "run_make_source", "shard_fingerprint", "to_int16", "utterance_audio",
    "write_shards",
]
