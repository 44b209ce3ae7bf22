"""What ``shardkit make`` reads, settled from its arguments, and the one call that packs it.

``resolve_source`` turns SOURCE, ``--from`` and the Kaldi flags into a ``MakeSource`` (a Kaldi data
directory's three files, or any other format's expanded paths; a format not named is recognised from
the files), ``check_field_options`` refuses the options that format has no use for, and
``run_make_source`` packs it: ``from_kaldi.run_make`` or ``manifests.run_make_from``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardkit.commands.make.report import MakeReport
from shardkit.commands.make.settings import MakeSettings
from shardkit.commands.make.sources import SourceOptions, detect_format, expand_globs
from shardkit.errors import UsageError
from shardkit.run.options import RunOptions


@dataclass(frozen=True)
class MakeSource:
    """What make reads, settled from SOURCE, --from and the Kaldi flags: a Kaldi data directory is
    its three files (``paths`` unused), any other format its expanded SOURCE paths."""
    fmt: str
    paths: list[str]
    wav_scp: str | None = None
    text: str | None = None
    segments: str | None = None


def resolve_source(source: tuple[str, ...], source_format: str | None, wav_scp: str | None, text: str | None,
                   segments: str | None) -> MakeSource:
    """The format and files to read: --wav-scp/--text name a Kaldi directory on their own; else
    SOURCE (globs expanded) in the --from format or the one recognised, and a Kaldi SOURCE folder
    gives its wav.scp, text and (when present and not given) segments."""
    if wav_scp is not None or text is not None:
        return _kaldi_flags(source, source_format, wav_scp, text, segments)
    if not source:
        raise UsageError("name a SOURCE (or --wav-scp and --text): see shardkit make --help")
    paths = expand_globs(list(source))
    fmt = source_format or detect_format(paths)
    if fmt != "kaldi":
        return MakeSource(fmt, paths, segments=segments)
    return _kaldi_folder(paths, segments)


def _kaldi_flags(source: tuple[str, ...], source_format: str | None, wav_scp: str | None, text: str | None,
                 segments: str | None) -> MakeSource:
    """A Kaldi data directory named by --wav-scp and --text (both, and without SOURCE or another --from)."""
    if source or source_format not in (None, "kaldi"):
        raise UsageError("--wav-scp/--text name a Kaldi data directory: give them without SOURCE or --from")
    if wav_scp is None or text is None:
        raise UsageError("a Kaldi data directory needs both --wav-scp and --text (or give the folder as SOURCE)")
    return MakeSource("kaldi", list(source), wav_scp, text, segments)


def _kaldi_folder(paths: list[str], segments: str | None) -> MakeSource:
    """A Kaldi data directory given as SOURCE: its wav.scp and text, and its segments when present and not given."""
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        raise UsageError("--from kaldi takes one data directory (holding wav.scp and text)")
    if segments is None and os.path.exists(os.path.join(paths[0], "segments")):
        segments = os.path.join(paths[0], "segments")
    return MakeSource("kaldi", paths, os.path.join(paths[0], "wav.scp"), os.path.join(paths[0], "text"), segments)


def check_field_options(src: MakeSource, fields: SourceOptions, audio_format: str | None,
                        resample: int | None) -> str | None:
    """Refuse the options the source's format has no use for (manifest fields and --channel for a
    Kaldi directory, --segments for the others) and settle a Kaldi directory's audio format: wav
    when utterances must be cut or resampled, else the source bytes kept."""
    if src.fmt != "kaldi":
        if src.segments is not None:
            raise UsageError("--segments is for Kaldi data directories")
        return audio_format
    if any(v is not None for v in (fields.key_field, fields.text_field, fields.audio_field, fields.channel)):
        raise UsageError("--key-field, --text-field, --audio-field and --channel are not for Kaldi directories")
    if audio_format is None:
        audio_format = "wav" if src.segments or resample else "keep"
    return audio_format


def run_make_source(src: MakeSource, out_dir: str, settings: MakeSettings, options: RunOptions | None = None, *,
                    source_options: SourceOptions = SourceOptions()) -> MakeReport:
    """Pack ``src`` into shards under ``out_dir``: a Kaldi directory through ``run_make``, any other
    format through ``run_make_from`` (``source_options``: its fields and channel)."""
    if src.fmt == "kaldi":
        from shardkit.commands.make.from_kaldi import run_make

        return run_make(src.wav_scp, src.text, out_dir, settings, options, segments=src.segments)
    from shardkit.commands.make.manifests import run_make_from

    return run_make_from(src.fmt, list(src.paths), out_dir, settings, options, source_options=source_options)
