"""Remote inputs and outputs: fsspec URLs (S3 on a loopback moto server, HTTP) and pipe: commands."""

import functools
import http.server
import os
import shlex
import threading

import pytest
from support import QuietHTTPHandler, free_port

from shardkit.errors import ShardkitError, UsageError
from shardkit.io.remote import (
    input_info,
    is_local,
    is_pipe,
    is_url,
    open_input,
    publish_output,
)
from shardkit.io.tar import iter_shard_members, iter_tar_members, shard_reader


def members_via(path, **kwargs):
    """Every (name, data) of a shard read through open_input, as shardkit's readers consume it."""
    with open_input(path, **kwargs) as f:
        return list(iter_tar_members(shard_reader(f, shard=path), shard=path))



@pytest.mark.parametrize("path, url, pipe", [
    ("/data/a.tar", False, False), ("rel/a.tar.zst", False, False), ("s3://bucket/a.tar", True, False),
    ("https://host/x/a.tar", True, False), ("hdfs://nn/a.tar", True, False), ("file:///data/a.tar", True, False),
    ("pipe:curl -s https://host/a.tar", False, True), ("c:/not-a-url", False, False),
])
def test_url_and_pipe_detection(path, url, pipe):
    assert (is_url(path), is_pipe(path), is_local(path)) == (url, pipe, not url and not pipe)


# --- local files and pipes ------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gz", "zst"])
def test_local_file_and_pipe_read_the_same_members(make_shards, codec):
    source = make_shards(codec)[0]
    expected = list(iter_shard_members(source))
    assert members_via(source) == expected
    assert members_via(f"pipe:cat {shlex.quote(source)}", allow_pipes=True) == expected


def test_missing_local_input_and_folder_are_named(tmp_path):
    with pytest.raises(ShardkitError) as err:
        open_input(str(tmp_path / "absent.tar"))
    assert str(err.value) == f"{tmp_path}/absent.tar: cannot open (no such file or object)"
    with pytest.raises(ShardkitError) as err:
        open_input(str(tmp_path))
    assert str(err.value) == f"{tmp_path}: is a directory, not a shard"


def test_a_failing_pipe_command_is_an_error_naming_it():
    with pytest.raises(ShardkitError) as err:
        with open_input("pipe:echo starting; echo 'no such object' >&2; exit 3", allow_pipes=True) as f:
            f.read()
    assert str(err.value) == "pipe:echo starting; echo 'no such object' >&2; exit 3: command exited with status 3 " \
                             "after writing 9 bytes: no such object"


def test_closing_a_pipe_early_is_not_an_error():
    with open_input("pipe:yes", allow_pipes=True) as f:
        assert f.read(6) == b"y\ny\ny\n"  # `yes` then dies of SIGPIPE: the reader had what it needed


def test_publish_local_output_replaces_atomically(tmp_path):
    tmp = tmp_path / ".out.tar.partial"
    tmp.write_bytes(b"new")
    (tmp_path / "out.tar").write_bytes(b"old")
    publish_output(str(tmp), str(tmp_path / "out.tar"))
    assert (tmp_path / "out.tar").read_bytes() == b"new" and not tmp.exists()
    with pytest.raises(UsageError, match="an output cannot be a pipe: command"):
        publish_output(str(tmp_path / "out.tar"), "pipe:cat > x")


def test_input_info_of_a_local_file(tmp_path):
    (tmp_path / "a.tar").write_bytes(b"x" * 10)
    info = input_info(str(tmp_path / "a.tar"))
    assert info["size"] == 10 and info["mtime_ns"] == os.stat(tmp_path / "a.tar").st_mtime_ns


# --- HTTP (a stdlib server on 127.0.0.1) -----------------------------------------------------------


@pytest.fixture
def http_folder(tmp_path):
    folder = tmp_path / "www"
    folder.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()),
                                             functools.partial(QuietHTTPHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_input_reads_the_same_members(make_shards, http_folder):
    pytest.importorskip("aiohttp")  # fsspec's HTTP driver
    folder, base = http_folder
    source = make_shards("zst")[0]
    (folder / "a.tar.zst").write_bytes(open(source, "rb").read())
    assert members_via(f"{base}/a.tar.zst") == list(iter_shard_members(source))
    with pytest.raises(ShardkitError) as err:
        open_input(f"{base}/missing.tar")
    assert str(err.value) == f"{base}/missing.tar: HTTP 404 File not found"
    assert err.value.check == "missing_file"


# --- S3 (moto's server on 127.0.0.1) ----------------------------------------------------------------


@pytest.mark.parametrize("codec", ["zst", "bz2", "none"])
def test_s3_input_reads_the_same_members(make_shards, s3_store, codec):
    fs, options = s3_store
    source = make_shards(codec)[0]
    key = f"corpus/in/{os.path.basename(source)}"
    fs.put_file(source, key)
    assert members_via(f"s3://{key}", storage_options=options) == list(iter_shard_members(source))
    info = input_info(f"s3://{key}", storage_options=options)
    assert info["size"] == os.path.getsize(source) and info["mtime_ns"] > 0


def test_s3_missing_object_is_named(s3_store):
    _, options = s3_store
    with pytest.raises(ShardkitError) as err:
        open_input("s3://corpus/in/absent.tar", storage_options=options)
    assert str(err.value) == "s3://corpus/in/absent.tar: no such file or object"
    assert err.value.check == "missing_file"


def test_s3_publish_goes_through_a_temporary_key(s3_store, tmp_path):
    fs, options = s3_store
    local = tmp_path / ".shard.tar.zst.partial"
    local.write_bytes(b"finished shard bytes")
    publish_output(str(local), "s3://corpus/out/shard.tar.zst", storage_options=options)
    fs.invalidate_cache()
    assert fs.cat("corpus/out/shard.tar.zst") == b"finished shard bytes"
    assert fs.ls("corpus/out", detail=False) == ["corpus/out/shard.tar.zst"]  # no temporary key left
    assert not local.exists()


def test_s3_publish_failure_leaves_nothing_and_keeps_the_local_file(s3_store, tmp_path):
    fs, options = s3_store
    local = tmp_path / ".shard.tar.partial"
    local.write_bytes(b"bytes")
    with pytest.raises(ShardkitError) as err:
        publish_output(str(local), "s3://no-such-bucket/out/shard.tar", storage_options=options)
    assert str(err.value).startswith("s3://no-such-bucket/out/shard.tar: cannot publish (")
    assert local.read_bytes() == b"bytes"
