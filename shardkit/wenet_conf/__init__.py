"""``--wenet-conf`` for plan and balance: what WeNet's trainer would drop, and how it would batch.

One feature, one package, its modules split along the seams (the pure ones: numbers in, numbers
out, numpy and the standard library only, no ``open``):

- ``conf`` (pure): WeNet's training conf as numbers (:class:`~shardkit.wenet_conf.conf.TrainerConf`);
- ``tokens`` (pure): WeNet's char and BPE tokenizers, reduced to the label length;
- ``load``: reads the YAML and the tokenizer files into a :class:`~shardkit.wenet_conf.load.TrainerSpec`;
- ``filter`` (pure): WeNet's ``processor.filter`` over arrays, and the summary of what it drops;
- ``frames``, ``order``, ``batches``, ``simulation`` (pure): feature frames, the shuffle and sort
  buffers, static/bucket/dynamic batches, and the epochs of a list (steps per rank and worker);
- ``blocks`` and ``columns``: the index columns the filter needs (balance's and plan's read);
- ``transcripts``: transcripts read back from shards, when a tokenizer counts tokens;
- ``verdict``: the filter over index columns (tokens, reasons, the report, the dropped keys);
- ``list_view`` (plan) and ``mix`` (balance): the feature inside each command;
- ``report``: the report's text and the dropped keys' file.

It sits above the step commands (plan's columns index shards through ``shardkit.commands.index``)
and below balance and plan.
"""
