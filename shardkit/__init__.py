"""shardkit: prepare sharded speech datasets (WeNet-style tar shards) for distributed ASR training."""

__version__ = "0.1.0"


def __getattr__(name):  # shardkit.iter_samples without importing numpy at `import shardkit`
    if name == "iter_samples":
        from shardkit.training.reader import iter_samples

        return iter_samples
    raise AttributeError(f"module 'shardkit' has no attribute {name!r}")
