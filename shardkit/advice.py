"""Compatibility path: ``shardkit.advice`` is ``shardkit.planning.advice`` (the same module object, so
attributes, patches and pickles agree). Internal code imports ``shardkit.planning.advice``."""

import sys

import shardkit.planning.advice as _real

sys.modules[__name__] = _real
