"""Pure, deterministic planning: functions of numbers with no I/O inside (how shards split across
ranks and workers, loader advice). The lowest layer beside ``shardkit.errors``."""
