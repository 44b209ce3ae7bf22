"""One shard written: ``<key>.txt`` then ``<key>.<audio>`` per utterance, through an atomic file that
is read back before it is named (``make_shard``), and the executor task around it (a result dict,
never an exception for bad data)."""

from __future__ import annotations

import time

from shardkit.commands.make.audio import utterance_audio
from shardkit.commands.make.settings import HEADER_FINDINGS, MakeSettings, finding
from shardkit.errors import AudioError, ShardkitError
from shardkit.io.codecs import open_writer
from shardkit.io.files import HashingFile, output_unchanged
from shardkit.io.indexfile import ShardRecords
from shardkit.io.tar import TarWriter
from shardkit.io.files import AtomicFile
from shardkit.io.files import os_reason
from shardkit.run.lifecycle import verify_stream

READ_AHEAD_BYTES = 8 << 20  # the next utterance is read while this one is written when its file is this small


def _audio_or_error(utt: dict, settings: MakeSettings):
    try:
        return utterance_audio(utt, settings)
    except (AudioError, OSError) as err:
        return err


def read_ahead(utterances: list[dict], settings: MakeSettings):
    """``(utterance, (extension, audio bytes) or the AudioError/OSError)`` in order. The next utterance
    is read (and decoded, encoded) in a thread while the caller writes and hashes this one, so a cold
    disk's or a URL's latency overlaps the hashing; only a file or URL whose size is known and at most
    READ_AHEAD_BYTES, so that at most one large member is ever held."""
    from concurrent.futures import ThreadPoolExecutor

    def small(utt: dict) -> bool:  # a file or URL (a tar member is one seek away in a file already open)
        source = utt["source"]
        size = source.get("size")
        return ("path" in source or "url" in source) and isinstance(size, int) and size <= READ_AHEAD_BYTES

    with ThreadPoolExecutor(1, thread_name_prefix="shardkit-read-ahead") as reader:
        ahead = None
        for i, utt in enumerate(utterances):
            got = ahead.result() if ahead is not None else _audio_or_error(utt, settings)
            following = utterances[i + 1] if i + 1 < len(utterances) else None
            ahead = reader.submit(_audio_or_error, following, settings) if following and small(following) else None
            yield utt, got


def _unreadable(key: str, err: Exception) -> dict:
    """The finding of an utterance whose audio could not be read (an AudioError or an OSError)."""
    if isinstance(err, AudioError):
        return finding(key, err.check if err.check in HEADER_FINDINGS else "unreadable_audio", err.reason)
    return finding(key, "unreadable_audio", f"cannot read {err.filename or ''} ({err.strerror or err})")


def make_shard(dst: str, utterances: list[dict], settings: MakeSettings) -> dict:
    """Write one shard (``<key>.txt`` then ``<key>.<audio>`` per utterance) atomically.

    An utterance whose audio cannot be read is skipped and listed; a shard left with no
    utterance is not written (``status: empty``).
    """
    started = time.perf_counter()
    result: dict = {"output": None, "status": "failed", "error": None, "utterances": 0, "seconds": 0.0,
                    "tar_bytes": 0, "skipped": []}
    try:
        with AtomicFile(dst) as target:
            _write_shard(target, dst, utterances, settings, result)
    except ShardkitError as err:
        result["error"] = str(err.located(shard=dst))
    except OSError as err:
        result["error"] = f"{dst}: {os_reason(err)}" + (f" ({err.filename})" if err.filename else "")
    result["elapsed"] = round(time.perf_counter() - started, 4)
    return result


def _write_shard(target: AtomicFile, dst: str, utterances: list[dict], settings: MakeSettings, result: dict) -> None:
    """``make_shard``'s body inside the atomic file: the members, then the read-back and the commit
    (``result`` filled in place); a shard without utterances is left unpublished."""
    hashing = HashingFile(target.file)
    out = open_writer(hashing, settings.codec, settings.level)
    # the tar stream's digest, computed while writing, is what the read-back is checked against
    # (for a plain tar the file's own digest, which the report records anyway)
    stream = hashing if settings.codec == "none" else HashingFile(out)
    tar = TarWriter(stream)
    written: list[tuple[str, int]] = []
    # the index of what is written, as a by-product (offsets from the writer, facts from the header)
    indexed = ShardRecords.for_shard(dst)
    for utt, got in read_ahead(utterances, settings):
        if isinstance(got, (AudioError, OSError)):
            result["skipped"].append(_unreadable(utt["key"], got))
            continue
        ext, audio = got
        text = utt["text"].encode("utf-8")
        for name, data in ((f"{utt['key']}.txt", text), (f"{utt['key']}.{ext}", audio)):
            tar.add(name, data)
            written.append((name, len(data)))
            indexed.add_written(tar.offset, name, data, len(data))
        result["utterances"] += 1
        result["seconds"] += utt["seconds"]
    result["tar_bytes"] = tar.close()
    out.close()
    result["seconds"] = round(result["seconds"], 3)
    if result["utterances"] == 0:
        result["status"] = "empty"  # leaving the block unpublished removes the temporary file
        return
    readback = verify_stream(written, stream.sha256.digest(), stream.size, shard=dst)
    target.commit(readback if settings.verify else None, sync_while_verifying=True)
    result["index_error"] = indexed.save()
    result["output"] = {"path": dst, "size": hashing.size, "sha256": hashing.sha256.hexdigest()}
    result["status"] = "ok"


def _shard_task(args):
    dst, utterances, settings, fingerprint = args
    entry = make_shard(dst, utterances, settings)
    entry["fingerprint"] = fingerprint
    entry["keys"] = [u["key"] for u in utterances]
    return entry


def _shard_failed(task, error: ShardkitError) -> dict:
    """The entry of a shard task that raised (any library's exception) or whose worker died: that shard failed."""
    dst, _, _, fingerprint = task
    return {"output": None, "status": "failed", "error": str(error.located(shard=dst)), "utterances": 0,
            "seconds": 0.0, "tar_bytes": 0, "skipped": [], "fingerprint": fingerprint, "keys": []}


def _still_valid(entry: dict | None, fingerprint: str) -> bool:
    if not entry or entry.get("status") != "ok" or entry.get("fingerprint") != fingerprint:
        return False
    return output_unchanged(entry["output"]["path"], entry["output"]["size"], entry["output"]["sha256"])
