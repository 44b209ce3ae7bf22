"""One exception family. Every message says where it failed: shard, member or key, and cause."""

from __future__ import annotations

import tarfile

# Some classes below also derive from a standard exception, so that code written against WebDataset
# (or any tarfile/OS reader) catches shardkit's errors where it catches theirs: a missing input is a
# FileNotFoundError, an unreadable one an OSError, a damaged stream or tar a tarfile.ReadError, a
# duplicated member a ValueError. ShardkitError stays the first base: its message and location win.


class ShardkitError(Exception):
    """Base of every error shardkit raises on purpose: one ``except`` catches them all.

    ``str(err)`` gives one line: ``SHARD: member 'MEMBER': REASON``. ``check`` names the family
    in reports (``"usage"``, ``"stream"``, ``"tar"``, ...); the CLI maps it to an exit code
    (2 for usage errors, 3 for a lost cluster, 1 for data).

    Args:
        reason: the cause, in words.
        shard: the shard (or file, or URL) where it failed, when known.
        member: the tar member or utterance key, when known.

    Example:
        ```python
        try:
            for sample in shardkit.iter_samples("data.list"):
                ...
        except shardkit.ShardkitError as err:
            print(err.shard, err.member, err.reason)
        ```
    """

    check = "error"

    def __init__(self, reason: str, *, shard: str | None = None, member: str | None = None):
        self.reason = reason
        self.shard = shard
        self.member = member
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.shard:
            parts.append(str(self.shard))
        if self.member:
            parts.append(f"member {self.member!r}")
        parts.append(self.reason)
        return ": ".join(parts)

    def located(self, *, shard: str | None = None, member: str | None = None) -> "ShardkitError":
        """Fill in the location where the raiser did not know it; returns self."""
        if shard and not self.shard:
            self.shard = shard
        if member and not self.member:
            self.member = member
        self.args = (self._format(),)
        return self


class UsageError(ShardkitError):
    """The command line, the arguments or the inputs named by them are wrong (exit code 2).

    Nothing was read or written yet, or the run refused to start: fix the call and rerun.

    Example:
        ```python
        try:
            shardkit.ShardDataset("missing/data.list")
        except shardkit.UsageError as err:
            print(err)
        ```
    """

    check = "usage"


class InputError(ShardkitError, OSError):
    """An input that could not be read: a URL (HTTP status, stalled, closed early, redirect loop), a
    ``pipe:`` command (exit status, stalled, refused without --allow-pipes). Fails that shard only.

    Example:
        ```python
        except shardkit.InputError as err:  # a store or a pipe command failed: retry later
            print("unreadable:", err.shard, err.reason)
        ```
    """

    check = "input"


class InputMissingError(InputError, FileNotFoundError):
    """An input that is not there (HTTP 404, no such key or file)."""

    check = "missing_file"


class ClusterError(ShardkitError):
    """The Ray cluster (its head, or the connection to it) was lost: not a data problem (exit code 3)."""

    check = "cluster"
    exit_code = 3


class CorruptStreamError(ShardkitError, tarfile.ReadError):
    """The compressed stream (gzip, bzip2, xz, zstd) is truncated or damaged (also a ``tarfile.ReadError``).

    Nothing after the damage can be trusted, so the shard's read ends there (with ``on_error``,
    the utterances before it were already yielded).

    Example:
        ```python
        except shardkit.CorruptStreamError as err:
            print("damaged shard:", err.shard)
        ```
    """

    check = "stream"


class TarFormatError(ShardkitError, tarfile.ReadError):
    """The tar container is malformed: bad header, checksum, truncated member, not a tar (also a
    ``tarfile.ReadError``).

    Its subclasses name the fault (checksum, number field, pax record, zero block, name chain,
    name encoding). What Python's tarfile (the trainer's parser) would reject is rejected here.

    Example:
        ```python
        except shardkit.TarFormatError as err:
            print(f"{err.shard}: rebuild this shard ({err.reason})")
        ```
    """

    check = "tar"


class EmptyTarError(TarFormatError):
    """A tar archive with no member (its end-of-archive blocks only): WebDataset reads it as no samples."""


class TarChecksumError(TarFormatError):
    """A header whose checksum does not match (tarfile stops reading there: the members after it are lost)."""

    check = "tar_checksum"


class TarNumberFieldError(TarFormatError):
    """A numeric header field (mode, uid, gid, size, mtime, checksum, device) that is not a number, or a
    negative size: tarfile stops reading there, or reads a member of a size no other reader agrees on."""

    check = "tar_number_field"


class TarPaxError(TarFormatError):
    """A pax extended header whose records are malformed or that readers apply differently."""

    check = "tar_pax"


class TarZeroBlockError(TarFormatError):
    """Data after an end-of-archive (zero) block: tarfile stops at the first zero block and loses it."""

    check = "tar_zero_block"


class TarNameChainError(TarFormatError):
    """Long-name or pax headers chained for one member (readers disagree on which name wins), or an
    extension header with no member after it."""

    check = "tar_name_chain"


class TarNameEncodingError(TarFormatError):
    """A member name that is not UTF-8 or holds a NUL byte (the message shows it escaped)."""

    check = "tar_name_encoding"


class UnsafeMemberError(ShardkitError):
    """A member that must never be extracted or trusted: traversal, absolute, link, device."""

    check = "unsafe_member"


class NonRegularMemberError(UnsafeMemberError):
    """A member that is not a regular file (directory, link, device, FIFO): never followed or extracted;
    readers that take only files (WebDataset) skip it."""


class UnsafeNameError(UnsafeMemberError):
    """A member name that would leave the folder if extracted (absolute, '..', backslash) or is empty."""


class DuplicateMemberError(ShardkitError, ValueError):
    """Two members of one sample with the same extension (WebDataset raises a ValueError there)."""

    check = "duplicate_member"


class MemberTooLargeError(ShardkitError):
    """A member above the configured size bound (``max_member_bytes``): refused so memory stays bounded.

    Example:
        ```python
        samples = shardkit.iter_samples("big.tar", max_member_bytes=1 << 30)  # raise the bound
        ```
    """

    check = "member_too_large"


class AudioError(ShardkitError):
    """An audio member that does not decode, or decodes to something other than promised.

    Example:
        ```python
        except shardkit.AudioError as err:
            print(f"bad audio in {err.shard}, utterance {err.member}: {err.reason}")
        ```
    """

    check = "audio"


class VerificationError(ShardkitError):
    """A written output does not read back to what was read from the source."""

    check = "verify"


def printable(text: str) -> str:
    """``text`` as valid UTF-8 text: bytes a file system name held that are not UTF-8 (Python keeps them as
    surrogate escapes) become ``\\xNN``. Names that were UTF-8 come back unchanged."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def json_safe(obj):
    """``obj`` with every string made ``printable``, so that a JSON report is always valid UTF-8."""
    if isinstance(obj, str):
        return printable(obj)
    if isinstance(obj, dict):
        return {json_safe(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
