"""shardkit: prepare sharded speech datasets (WeNet-style tar shards) for distributed ASR training.

The public Python API is ``shardkit.__all__``: every name is imported on first use, so
``import shardkit`` stays light (no numpy, no torch). Each name is defined in one module of the
package (``_PUBLIC`` says which); the command line (``shardkit --help``) is the other interface.

Example::

    import shardkit
    for sample in shardkit.iter_samples("data/data.list"):
        print(sample["key"], sample["txt"], sample["audio"].shape)
"""

import importlib

from shardkit._aliases import install as _install_aliases

__version__ = "0.1.0"

# name -> the module that defines it (the API reference is generated from this table)
_PUBLIC = {
    "iter_samples": "shardkit.training.reader",
    "ShardDataset": "shardkit.training.dataset",
    "collate_padded": "shardkit.training.dataset",
    "collate_packed": "shardkit.training.dataset",
    "audio_float": "shardkit.training.dataset",
    "equal_steps": "shardkit.training.steps",
    "EqualSteps": "shardkit.training.steps",
    "enable_zstd": "shardkit.training.zstd_hook",
    "zstd_status": "shardkit.training.zstd_hook",
    "ShardkitError": "shardkit.errors",
    "UsageError": "shardkit.errors",
    "InputError": "shardkit.errors",
    "CorruptStreamError": "shardkit.errors",
    "AudioError": "shardkit.errors",
}

__all__ = list(_PUBLIC)

_install_aliases()


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
