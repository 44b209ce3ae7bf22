"""Compatibility path: ``shardkit.wds`` is ``shardkit.training.wds`` (the same module object, so
attributes, patches and pickles agree). Internal code imports ``shardkit.training.wds``."""

import sys

import shardkit.training.wds as _real

sys.modules[__name__] = _real
