"""JSON-lines manifests read line by line (NeMo, WeNet raw, a tarred dataset's manifest): one object per
non-blank line, a line that is not a JSON object said with its number instead of raised, so a reader can
report it and go on."""

from __future__ import annotations

import zlib
from typing import BinaryIO, Iterator

from shardkit.errors import UsageError


def iter_json_objects(f: BinaryIO, *, path: str, what: str = "") -> Iterator[tuple[int, dict | None, str]]:
    """``(line number, object or None, why not)`` per non-blank line of the open binary file ``f``; a file that
    stops being readable is a UsageError naming ``path`` ("cannot read{what} (...)")."""
    import orjson

    try:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as err:
                yield number, None, f"line {number} is not JSON ({str(err).split(':')[0]})"
                continue
            if not isinstance(obj, dict):
                yield number, None, f"line {number} is not a JSON object"
                continue
            yield number, obj, ""
    except (OSError, EOFError, zlib.error) as err:
        raise UsageError(f"cannot read{what} ({err})", shard=path) from None
