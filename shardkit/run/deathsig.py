"""Imported first in the forkserver process (``executor.forkserver_context``): it dies with the
process that started it, so a kill -9 of a run leaves no server forking workers for it."""

from shardkit.run.executor import die_with_parent

die_with_parent()
