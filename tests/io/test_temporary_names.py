"""One rule names a killed run's temporary files, on a local folder and in a store (io.files.is_temporary_of)."""

import fsspec

from shardkit.io.files import remove_leftovers, remove_temporary_keys, temp_path

NAMES = [
    ".a.tar.0123456789ab.partial",  # what temp_path makes for a.tar
    ".a.tar.partial",  # what versions before the random part made
    ".a.tar.notahex!.partial",  # not a token: a user's file
    ".b.tar.0123456789ab.partial",  # another output's temporary file: another slice may be writing it
    "a.tar.0123456789ab.partial",  # no leading dot
    ".a.tar.0123456789ab.part",  # another suffix
    "a.tar",  # the output itself
]
REMOVED = {".a.tar.0123456789ab.partial", ".a.tar.partial"}


def test_a_local_folder_and_a_store_lose_the_same_names(tmp_path):
    for name in NAMES:
        (tmp_path / name).write_bytes(b"x")
    assert remove_leftovers([str(tmp_path / "a.tar")]) == len(REMOVED)
    assert {p.name for p in tmp_path.iterdir()} == set(NAMES) - REMOVED

    fs = fsspec.filesystem("memory")
    for name in NAMES:
        fs.pipe(f"/leftovers/{name}", b"x")
    remove_temporary_keys(["memory://leftovers/a.tar"])
    assert {p.rpartition("/")[2] for p in fs.ls("/leftovers", detail=False)} == set(NAMES) - REMOVED


def test_the_names_temp_path_makes_are_leftovers(tmp_path):
    dst = str(tmp_path / "shard-000.tar")
    for _ in range(3):
        open(temp_path(dst), "wb").close()
    assert remove_leftovers([dst]) == 3
    assert list(tmp_path.iterdir()) == []
