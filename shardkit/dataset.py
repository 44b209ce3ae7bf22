"""Compatibility path: ``shardkit.dataset`` is ``shardkit.training.dataset`` (the same module object, so
attributes, patches and pickles agree). Internal code imports ``shardkit.training.dataset``."""

import sys

import shardkit.training.dataset as _real

sys.modules[__name__] = _real
