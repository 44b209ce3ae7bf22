"""shardkit: prepare sharded speech datasets (WeNet-style tar shards) for distributed ASR training."""

__version__ = "0.1.0"
