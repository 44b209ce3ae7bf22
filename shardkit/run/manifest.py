"""Atomic files and resumable run manifests: the names older code imports, now kept in ``lifecycle``."""

from __future__ import annotations

from shardkit.run.lifecycle import (  # noqa: F401
    AtomicFile,
    Journal,
    OutputError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_lines,
    fsync_dir,
    load_json,
    prepare_out_dir,
)
