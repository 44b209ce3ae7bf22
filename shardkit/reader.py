"""Compatibility path: ``shardkit.reader`` is ``shardkit.training.reader`` (the same module object, so
attributes, patches and pickles agree). Internal code imports ``shardkit.training.reader``."""

import sys

import shardkit.training.reader as _real

sys.modules[__name__] = _real
