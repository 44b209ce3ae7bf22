"""Compatibility path: ``shardkit._zstd_tarfile`` is ``shardkit.io.zstd_tarfile`` (the same module object, so
attributes, patches and pickles agree). Internal code imports ``shardkit.io.zstd_tarfile``."""

import sys

import shardkit.io.zstd_tarfile as _real

sys.modules[__name__] = _real
