"""WebDataset 1.0.2's own tests, run against shardkit's drop-ins (issue 36).

Every test here is webdataset's, unchanged but for one import line (see README.md). This file
puts ``shardkit.training.wds.tarfile_to_samples`` and ``shardkit.training.wds.WebDataset`` in
place of ``webdataset.tarfile_to_samples`` and ``webdataset.WebDataset`` for each test, allows
``pipe:`` URLs (the suite's truncated-shard tests read ``pipe:dd ...``), builds the test data
webdataset keeps out of its source distribution, and deselects the tests that need the network.
``SHARDKIT_WDS_SUITE=webdataset`` runs the same tests on webdataset itself (the reference: all pass).
"""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WEBDATASET_VERSION = "1.0.2"

# Tests that open remote URLs (storage.googleapis.com): not run in CI, which has no network.
NETWORK = {
    "test_cache.py::TestStreamingOpen::test_remote_file", "test_cache.py::TestFileCache::test_remote_file",
    "test_compat.py::test_decoder", "test_compat.py::test_cache_dir", "test_compat.py::test_shard_syntax",
    "test_compat.py::test_torchvision", "test_compat.py::test_batched", "test_compat.py::test_unbatched",
    "test_decode.py::test_decoders", "test_decode.py::test_handlers",
    "test_handlers.py::test_missing_throws2", "test_loaders.py::test_dataloader",
    "test_pipeline.py::test_dataloader", "test_pipeline.py::test_decode_handlers", "test_pipeline.py::test_decoder",
    "test_pipeline.py::test_pipe", "test_pipeline.py::test_torchvision", "test_pipeline.py::test_batched",
    "test_pipeline.py::test_unbatched",
}

# The one place where a test that passes on webdataset may fail on the drop-ins: test id -> the
# documented policy difference (see shardkit.training.wds.tarfile_to_samples). Run as
# xfail(strict=True), so a difference that goes away is noticed. Empty: every test passes.
POLICY_DIFFERENCES: dict[str, str] = {}


def _under_test() -> str:
    return os.environ.get("SHARDKIT_WDS_SUITE", "shardkit")


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: mark test as quick to run")
    config.addinivalue_line("markers", "notorch: mark test as not requiring torch")


def pytest_collection_modifyitems(config, items):
    here = [item for item in items if str(item.path).startswith(HERE + os.sep)]
    deselected = [item for item in here if _local_id(item) in NETWORK]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
    for item in here:
        if _under_test() == "shardkit" and _local_id(item) in POLICY_DIFFERENCES:
            item.add_marker(pytest.mark.xfail(reason=POLICY_DIFFERENCES[_local_id(item)], strict=True))


def _local_id(item) -> str:
    return f"{os.path.relpath(item.path, HERE)}::{'::'.join(item.nodeid.split('::')[1:])}"


def _missing_requirement() -> str | None:
    try:
        import webdataset
    except ImportError:
        return "webdataset is not installed (pip install 'shardkit[wds]')"
    if webdataset.__version__ != WEBDATASET_VERSION:
        return f"these are webdataset {WEBDATASET_VERSION}'s tests; webdataset {webdataset.__version__} is installed"
    for module in ("PIL", "imageio", "lmdb", "msgpack", "torch"):
        try:
            __import__(module)
        except ImportError:
            return f"webdataset's tests need {module} (pip install 'shardkit[test,torch]')"
    return None


# Without what webdataset's tests import at the top of their modules, they are not collected at all
# (an import error is not a skip); the header says why.
collect_ignore_glob = ["test_*.py"] if _missing_requirement() else []


def pytest_report_header(config):
    missing = _missing_requirement()
    return f"webdataset_suite: not run: {missing}" if missing else None


@pytest.fixture(scope="session")
def webdataset_testdata(tmp_path_factory):
    """A folder holding ``testdata/`` as webdataset's tests expect it (they name it relative to the cwd)."""
    root = tmp_path_factory.mktemp("webdataset_suite")
    data = root / "testdata"
    data.mkdir()
    (data / "compressed.tar").write_bytes(open(os.path.join(HERE, "testdata", "compressed.tar"), "rb").read())
    _write_imagenet_like(data / "imagenet-000000.tgz")
    _write_tendata(data / "tendata.tar")
    return root


def _write_imagenet_like(path, samples: int = 47) -> None:
    """webdataset's imagenet-000000.tgz as its tests read it: 47 samples of cls, png (793x600 RGB), wnid, xml;
    large enough (about 100 KB) that its first 10 KB, which the truncation tests read, end inside it."""
    import PIL.Image

    rng = np.random.default_rng(36)
    with tarfile.open(path, "w:gz") as tar:
        for i in range(samples):
            image = np.full((793, 600, 3), (i * 5) % 256, np.uint8)
            image[:24, :40] = rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)  # incompressible: a real size
            png = io.BytesIO()
            PIL.Image.fromarray(image).save(png, format="PNG")
            fields = {"cls": str(i % 10).encode(), "png": png.getvalue(), "wnid": f"n{i:08d}".encode(),
                      "xml": b"<annotation/>"}
            for ext, data in fields.items():
                _add(tar, f"n{i:08d}_{i}.{ext}", data)


def _write_tendata(path, samples: int = 100) -> None:
    """webdataset's tendata.tar: 100 samples whose ``ten`` member holds two float64 28x28 arrays (tenbin)."""
    from webdataset import tenbin

    rng = np.random.default_rng(36)
    with tarfile.open(path, "w") as tar:
        for i in range(samples):
            _add(tar, f"{i:06d}.ten", bytes(tenbin.encode_buffer([rng.random((28, 28)), rng.random((28, 28))])))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), 0
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(autouse=True)
def _drop_ins_in_place(monkeypatch, webdataset_testdata):
    """Each test runs in the test-data folder, with shardkit's two objects in webdataset's namespace."""
    import webdataset

    from shardkit.training import wds as shardkit_wds

    monkeypatch.chdir(webdataset_testdata)
    if _under_test() == "shardkit":
        monkeypatch.setattr(webdataset, "tarfile_to_samples", shardkit_wds.tarfile_to_samples)
        monkeypatch.setattr(webdataset, "WebDataset", shardkit_wds.WebDataset)
        monkeypatch.setenv("SHARDKIT_ALLOW_PIPES", "1")  # the target: pipe: URLs allowed
    yield
