"""A source's entries as columns (``Catalog``: numbers in arrays, strings packed, no object per
utterance, so a manifest of millions of lines plans in bounded memory), and ``ShardBuilder``, which
turns the planned entries back into the utterance dicts the writer takes, one shard at a time."""

from __future__ import annotations

import math
import os
from array import array
from typing import NamedTuple

import numpy as np

from shardkit.commands.make.sources import Entry, SourceOptions, member_key
from shardkit.io.remote import is_url


class StringColumn:
    """Many strings packed into one UTF-8 buffer with end offsets (about 1 + 8 bytes of overhead each)."""

    def __init__(self):
        self._data = bytearray()
        self._ends = array("q")

    def append(self, text: str) -> None:
        """Add one string at the end (stored as UTF-8, lone surrogates kept)."""
        self._data += text.encode("utf-8", "surrogatepass")
        self._ends.append(len(self._data))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> str:
        start = self._ends[i - 1] if i else 0
        return self._data[start:self._ends[i]].decode("utf-8", "surrogatepass")

    def nbytes(self) -> int:
        """Memory the column holds: its bytes plus 8 per string for the end offsets."""
        return len(self._data) + 8 * len(self._ends)


class Catalog:
    """The entries of a source as columns (see ``sources.Entry`` for the meaning of each)."""

    def __init__(self):
        self.keys, self.texts = StringColumn(), StringColumn()
        # audio locations, a run of entries in one file (segments of a recording) stored once
        self.audio_names = StringColumn()
        self.audio_id = array("q")
        self._last_audio: str | None = None
        self.containers: list[str] = []
        self._container_ids: dict[str, int] = {}
        self.container = array("i")
        self.pos, self.size = array("q"), array("q")
        self.start, self.duration, self.total = array("d"), array("d"), array("d")
        self.segment = array("b")
        self.channel, self.channels = array("h"), array("h")
        self.rate = array("i")

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, e: Entry) -> None:
        """Append one source entry's fields to the columns (a run of entries in one audio file stores its name once)."""
        self.keys.append(e.key)
        self.texts.append(e.text)
        if e.audio != self._last_audio:
            self.audio_names.append(e.audio)
            self._last_audio = e.audio
        self.audio_id.append(len(self.audio_names) - 1)
        if e.container is None:
            self.container.append(-1)
        else:
            cid = self._container_ids.get(e.container)
            if cid is None:
                cid = self._container_ids[e.container] = len(self.containers)
                self.containers.append(e.container)
            self.container.append(cid)
        self.pos.append(e.pos)
        self.size.append(e.size)
        self.start.append(e.start)
        self.duration.append(math.nan if e.duration is None else e.duration)
        self.segment.append(e.segment)
        self.channel.append(-1 if e.channel is None else e.channel)
        self.total.append(math.nan if e.total is None else e.total)
        self.rate.append(e.rate)
        self.channels.append(e.channels)

    def audio(self, i: int) -> str:
        """The audio location (file, URL, command or member name) of entry ``i``."""
        return self.audio_names[self.audio_id[i]]

    def nbytes(self) -> int:
        """Memory every column holds, for the report and the memory bound."""
        columns = (self.audio_id, self.container, self.pos, self.size, self.start, self.duration, self.total,
                   self.segment, self.channel, self.channels, self.rate)
        return (self.keys.nbytes() + self.texts.nbytes() + self.audio_names.nbytes()
                + sum(a.itemsize * len(a) for a in columns))


class FileFacts(NamedTuple):
    """What probing files learned per entry (``manifests.probe_files``): two int64 columns, each file's
    size and mtime (0 where the entry's audio is no file), and ``{entry index: reason}`` for the unreadable."""

    size: np.ndarray
    mtime_ns: np.ndarray
    errors: dict[int, str]


class EntryPlan(NamedTuple):
    """Which entries become utterances and how: ``indices`` (the good entries, in source order),
    ``cuts`` (shard ``k`` holds ``indices[cuts[k]:cuts[k + 1]]``), and per entry the ``seconds`` it
    lasts and whether it is ``cut`` out of its audio (a segment or one channel)."""

    indices: np.ndarray
    cuts: list[int]
    seconds: np.ndarray
    cut: np.ndarray


class ShardBuilder:
    """Builds the utterance dicts ``write.write_shards`` writes, one shard at a time."""

    def __init__(self, catalog: Catalog, plan: EntryPlan, files: FileFacts, fmt: str, options: SourceOptions):
        self.catalog = catalog
        self.indices, self.cuts, self.seconds, self.cut = plan
        self.fsize, self.fmtime = files.size, files.mtime_ns
        self.fmt, self.options = fmt, options
        self.container_stat = []
        for path in catalog.containers:
            st = os.stat(path)
            self.container_stat.append((st.st_size, st.st_mtime_ns))

    def __len__(self) -> int:
        return max(0, len(self.cuts) - 1)

    def source(self, i: int) -> dict:
        """How entry ``i``'s audio is found again, as make.json records it: a file, URL or command, a
        member of a WebDataset tar (offset, size, the tar's size and mtime), or a Parquet cell (row group, row).
        """
        cid = self.catalog.container[i]
        if cid < 0:
            return self._file_source(i)
        c = self.catalog
        audio = c.audio(i)
        path = c.containers[cid]
        size, mtime = self.container_stat[cid]
        if self.fmt in ("wds", "shar", "nemo-tarred"):  # audio members of tars
            return {"tar": path, "member": audio, "name": audio, "offset": c.pos[i], "size": c.size[i],
                    "tar_size": size, "tar_mtime_ns": mtime}
        return {"parquet": path, "row_group": c.pos[i], "row": c.size[i], "column": self.options.audio_field or "audio",
                "name": audio, "file_size": size, "file_mtime_ns": mtime}

    def _file_source(self, i: int) -> dict:
        """The source of an entry whose audio is a file, a URL or a command (not in a container)."""
        audio = self.catalog.audio(i)
        if audio.startswith("pipe:"):
            return {"command": audio[5:]}
        if is_url(audio):
            return {"url": audio, "name": audio, "size": int(self.fsize[i])}  # checked when fetched
        return {"path": audio, "size": int(self.fsize[i]), "mtime_ns": int(self.fmtime[i])}

    def __call__(self, k: int) -> list[dict]:
        c = self.catalog
        out = []
        for i in self.indices[self.cuts[k]:self.cuts[k + 1]]:
            i = int(i)
            cut = bool(self.cut[i])
            start = c.start[i]
            out.append({"key": member_key(c.keys[i]), "text": c.texts[i], "source": self.source(i),
                        "start": start if cut else None,
                        "end": start + float(self.seconds[i]) if cut else None,
                        "channel": (c.channel[i] if c.channel[i] >= 0 and c.channels[i] > 1 else None),
                        "seconds": round(float(self.seconds[i]), 6), "sample_rate": int(c.rate[i])})
        return out
