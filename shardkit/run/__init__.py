"""The run lifecycle and job machinery: claimed output folders, journals and atomic commits, the
executor (processes, threads, Ray), ``--split I/N`` slices and the merging of their reports. Above
``shardkit.io``; knows no command (each command registers its own report merger)."""
