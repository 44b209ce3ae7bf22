"""shardkit's own check (not webdataset's): the suite here really runs the drop-ins, not webdataset's readers."""

import pytest
import webdataset as wds

from shardkit.training import wds as shardkit_wds
from webdataset_suite.conftest import _under_test


@pytest.mark.skipif(_under_test() != "shardkit", reason="SHARDKIT_WDS_SUITE=webdataset: webdataset's own objects")
def test_the_suite_reads_through_shardkits_drop_ins():
    dataset = wds.WebDataset("testdata/compressed.tar", shardshuffle=False)
    assert any(isinstance(stage, shardkit_wds.tarfile_to_samples) for stage in dataset.pipeline)
    assert isinstance(wds.tarfile_to_samples(), shardkit_wds.tarfile_to_samples)
    assert [sample["__key__"] for sample in dataset] == ["compressed/0001", "compressed/0002", "compressed/0003"]
