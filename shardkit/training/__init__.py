"""The training side: what a trainer imports. The streaming reader, ``ShardDataset``, the WebDataset
stages, shared-memory batches and the WeNet bridge. Above ``shardkit.io`` and ``shardkit.planning``;
never imports the writers' run lifecycle or a command."""
