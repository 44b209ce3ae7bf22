"""Shared I/O, the bottom layer: the tar parser, codecs, audio headers and decoding, inputs (local
paths, URLs, ``pipe:`` commands, object stores), transcoding and synthetic audio. It imports nothing
of shardkit but ``shardkit.errors``."""
