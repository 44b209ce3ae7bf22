"""shardkit: prepare sharded speech datasets (WeNet-style tar shards) for distributed ASR training.

The public Python API is ``shardkit.__all__``: every name is imported on first use, so
``import shardkit`` stays light (no numpy, no torch). Each name is defined in one module of the
package (``_PUBLIC`` says which); the command line (``shardkit --help``) is the other interface.

Example:
    ```python
    import shardkit

    for sample in shardkit.iter_samples("data/data.list"):
        print(sample["key"], sample["txt"], sample["audio"].shape)
    ```
"""

import importlib

from shardkit._aliases import install as _install_aliases

__version__ = "0.1.0"

# name -> the module that defines it (the API reference is generated from this table). What a
# trainer's code needs: read shards, feed a DataLoader, keep ranks in step, resume, read zstd in
# WeNet, and catch what goes wrong. The commands' library functions (shardkit.commands.*) stay
# behind the CLI; the WebDataset stages live in shardkit.training.wds, where users import them.
_PUBLIC = {
    # reading shards
    "iter_samples": "shardkit.training.reader",
    "warn_and_skip": "shardkit.training.reader",
    # a torch DataLoader over shards
    "ShardDataset": "shardkit.training.dataset",
    "collate_padded": "shardkit.training.dataset",
    "collate_packed": "shardkit.training.dataset",
    "pad_packed": "shardkit.training.dataset",
    "audio_float": "shardkit.training.dataset",
    # the same number of steps on every rank
    "equal_steps": "shardkit.training.steps",
    "EqualSteps": "shardkit.training.steps",
    # resuming a run's data
    "gather_loader_state": "shardkit.training.state",
    "restore_loader_state": "shardkit.training.state",
    # WeNet's tarfile reading .tar.zst
    "enable_zstd": "shardkit.training.zstd_hook",
    "disable_zstd": "shardkit.training.zstd_hook",
    "zstd_status": "shardkit.training.zstd_hook",
    # the exception family (every other error of shardkit derives from ShardkitError)
    "ShardkitError": "shardkit.errors",
    "UsageError": "shardkit.errors",
    "InputError": "shardkit.errors",
    "CorruptStreamError": "shardkit.errors",
    "TarFormatError": "shardkit.errors",
    "MemberTooLargeError": "shardkit.errors",
    "AudioError": "shardkit.errors",
    "StateMismatchError": "shardkit.training.state",
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
