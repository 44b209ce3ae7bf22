"""Compatibility path: ``shardkit.training.wenet`` is ``shardkit.training.zstd_hook`` (the same module
object, so attributes, patches and pickles agree). Internal code imports ``shardkit.training.zstd_hook``."""

import sys

import shardkit.training.zstd_hook as _real

sys.modules[__name__] = _real
