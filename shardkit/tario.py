"""Compatibility path: ``shardkit.tario`` is ``shardkit.io.tar`` (the same module object, so
attributes, patches and pickles agree). Internal code imports ``shardkit.io.tar``."""

import sys

import shardkit.io.tar as _real

sys.modules[__name__] = _real
