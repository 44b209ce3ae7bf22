"""validate's check names, as findings carry them, and the one shape of a finding.

A finding is ``{"shard", "key", "member", "check", "message"}``; ``check`` is one of ``CHECKS`` (data
problems: a reason to reject an utterance and to exit 1) or of ``WARNINGS`` (reported only).
"""

from __future__ import annotations

from shardkit.io.audio import (
    AUDIO_CHANNELS,
    AUDIO_FORMAT,
    AUDIO_HEADER,
    DECODED_TOO_LONG,
    FLAC_MD5,
    FLAC_METADATA,
    FLAC_STREAMINFO,
    IMPLAUSIBLE_LENGTH,
)
from shardkit.io.text import EMPTY_TEXT, KEY_CONTROL, TEXT_CONTROL

# Check names, as they appear in findings. Container:
STREAM = "stream"  # compressed stream truncated or damaged
TAR = "tar"  # not a tar, truncated header or member
# Headers that Python's tarfile (what WeNet and WebDataset read with) could read differently:
TAR_CHECKSUM = "tar_checksum"  # a header's checksum does not match: tarfile stops there
TAR_NUMBER_FIELD = "tar_number_field"  # garbage in mode/uid/gid/size/mtime/checksum/device fields, negative size
TAR_PAX = "tar_pax"  # malformed pax records, a pax size that is not a number, GNU sparse, global path/size
TAR_ZERO_BLOCK = "tar_zero_block"  # data after an end-of-archive block: tarfile stops at the first one
TAR_NAME_CHAIN = "tar_name_chain"  # chained long-name/pax headers, or one with no member after it
TAR_NAME_ENCODING = "tar_name_encoding"  # member name not UTF-8, or holding a NUL (shown escaped)
UNSAFE_MEMBER = "unsafe_member"  # '..', absolute, link, device, directory
MEMBER_TOO_LARGE = "member_too_large"
EMPTY_SHARD = "empty_shard"
MISSING_FILE = "missing_file"  # a shard (e.g. a data.list line) that names no readable file
INPUT = "input"  # a URL or pipe: command that could not be read (HTTP status, stalled, closed early, exit status)
TASK = "task"  # the shard's task raised or its worker died: nothing of it was checked
# Grouping (WeNet's rule: prefix before the last '.', members of one utterance adjacent):
MISSING_TXT = "missing_txt"
MISSING_AUDIO = "missing_audio"
MULTIPLE_AUDIO = "multiple_audio"
MULTIPLE_TXT = "multiple_txt"
SPLIT_KEY = "split_key"  # members of one key apart in the shard
DUPLICATE_KEY = "duplicate_key"  # a complete utterance's key again, in this shard or an earlier one
# Text:
TEXT_ENCODING = "text_encoding"
# EMPTY_TEXT: nothing left after removing whitespace and invisible characters (BOM, zero-width);
# TEXT_CONTROL: a NUL or another control character than tab, CR and LF; KEY_CONTROL: a key holding a control
# character (it cannot appear in a list line). Defined in shardkit.io.text, which make shares.
# Audio:
DECODE = "decode"
TRUNCATED = "truncated"
EMPTY_AUDIO = "empty_audio"
NAN = "nan"
SAMPLE_RATE = "sample_rate"
CHANNELS = "channels"
MIXED_AUDIO = "mixed_audio"  # --strict: more than one sample rate, channel count or audio format in the corpus
CORPUS = "(corpus)"  # the shard field of a finding about every shard together
DURATION = "duration"
FORMAT_MISMATCH = "format_mismatch"

# A NeMo tarred dataset or Shar folder (validate.layouts): the declared duration against the decoded audio; the
# reader's own findings carry io.layouts.sources' check names (bad_line, no_audio, no_line, misplaced, ...).
DECLARED_DURATION = "declared_duration"

CHECK_ERROR = "check_error"  # a check itself failed on the member (an exception nobody foresaw)

# Warnings: reported, never a reason to reject or to exit 1 (see ValidateReport.exit_code).
KEY_DOT = "key_dot"  # a '.' in the key's last path part: WebDataset's key ends at the first '.', WeNet's at the last
WARNINGS = (KEY_DOT,)

# Audio headers a decoder refuses or reads differently (shardkit.io.audio names them for index and make too):
# AUDIO_FORMAT, AUDIO_HEADER, AUDIO_CHANNELS, FLAC_METADATA, FLAC_STREAMINFO, IMPLAUSIBLE_LENGTH; and after the
# decode FLAC_MD5 (a set MD5 signature the samples do not match), DECODED_TOO_LONG (above --max-decoded-seconds).

CHECKS = (STREAM, TAR, TAR_CHECKSUM, TAR_NUMBER_FIELD, TAR_PAX, TAR_ZERO_BLOCK, TAR_NAME_CHAIN, TAR_NAME_ENCODING,
          UNSAFE_MEMBER, MEMBER_TOO_LARGE, EMPTY_SHARD, MISSING_FILE, INPUT, TASK, MISSING_TXT, MISSING_AUDIO,
          MULTIPLE_AUDIO, MULTIPLE_TXT, SPLIT_KEY, DUPLICATE_KEY, TEXT_ENCODING, EMPTY_TEXT, TEXT_CONTROL, KEY_CONTROL,
          DECODE, TRUNCATED, EMPTY_AUDIO, NAN, SAMPLE_RATE, CHANNELS, DURATION, FORMAT_MISMATCH, AUDIO_FORMAT,
          AUDIO_HEADER, AUDIO_CHANNELS, FLAC_METADATA, FLAC_STREAMINFO, IMPLAUSIBLE_LENGTH, FLAC_MD5, DECODED_TOO_LONG,
          CHECK_ERROR)


def finding(shard: str, key: str | None, member: str | None, check: str, message: str) -> dict:
    """A finding as reports carry it: where (shard, key, member), which check, and the message."""
    return {"shard": shard, "key": key, "member": member, "check": check, "message": message}
