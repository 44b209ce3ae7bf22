"""Resuming mid-epoch: exact with the same topology, elastic across world sizes and workers, refused
for another list. Real shards (plain, zst, bz2), real torchdata StatefulDataLoader, restores in a
new process (torch.save / torch.load of the loader states, as a trainer's checkpoint holds them)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tarfile

import pytest

from shardkit.io.synth import CorpusSpec
from support import corpus

torch = pytest.importorskip("torch")
pytest.importorskip("torchdata")
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from shardkit.planning.resume import deal_remaining, rank_loads  # noqa: E402
from shardkit.training import state as resume_state  # noqa: E402
from shardkit.training.dataset import ShardDataset, collate_padded  # noqa: E402
from shardkit.training.reader import ReadPosition, iter_samples  # noqa: E402

pytestmark = pytest.mark.torch

# 48 short utterances, 4 per shard: 12 shards, enough steps to stop early, midway and late
SPECS = (CorpusSpec("aishell", 30, 0.2, 0.6, "zh"), CorpusSpec("accented", 18, 0.2, 0.8, "mix"))
SEED = 7
BATCH = 3


@pytest.fixture(scope="module")
def shard_sets(tmp_path_factory):
    from shardkit.io.synth import write_shards

    utts = corpus(SPECS)
    out = {}
    for codec in ("none", "zst", "bz2"):
        folder = tmp_path_factory.mktemp(f"resume-{codec}")
        out[codec] = write_shards(utts, str(folder), utts_per_shard=4, codec=codec, audio_format="wav")
    out["keys"] = sorted(u[0] for u in utts)
    return out


def _loader(dataset, workers):
    return StatefulDataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=collate_padded)


# The restoring side, in a new process: a fresh dataset and loader, the checkpoint loaded with
# torch.load(weights_only=True) (the state is plain values), restore_loader_state(), then every key to the end.
RESTORE = r"""
import json, sys, torch
from torchdata.stateful_dataloader import StatefulDataLoader
from shardkit import ShardDataset, collate_padded, restore_loader_state
args = json.loads(sys.argv[1])
out = {}
for name, path in args["states"].items():
    dataset = ShardDataset(args["shards"], seed=args["seed"], rank=0, world_size=1)
    loader = StatefulDataLoader(dataset, batch_size=args["batch"], num_workers=args["workers"],
                                collate_fn=collate_padded)
    checkpoint = torch.load(path, weights_only=True)
    dataset.set_epoch(checkpoint["epoch"])
    mode = restore_loader_state(loader, dataset, checkpoint["loader"])
    out[name] = {"mode": mode, "keys": [batch["key"] for batch in loader]}
print(json.dumps(out))
"""


@pytest.mark.parametrize("codec,workers", [("none", 0), ("none", 1), ("none", 2), ("zst", 0), ("zst", 2),
                                           ("bz2", 0), ("bz2", 2)])
def test_restore_in_a_new_process_continues_exactly(shard_sets, tmp_path, codec, workers):
    shards = shard_sets[codec]
    loader = _loader(ShardDataset(shards, seed=SEED, rank=0, world_size=1), workers)
    full, saved = [], {}
    steps = len(shard_sets["keys"]) // BATCH  # 16
    stops = {1, 7, steps - 1}
    for step, batch in enumerate(loader, 1):
        full.append(batch["key"])
        if step in stops:
            path = str(tmp_path / f"step{step}.pt")
            torch.save({"epoch": 0, "step": step, "loader": resume_state.gather_loader_state(loader)}, path)
            saved[str(step)] = path
    assert sorted(k for b in full for k in b) == shard_sets["keys"]
    args = {"shards": shards, "seed": SEED, "batch": BATCH, "workers": workers, "states": saved}
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", RESTORE, json.dumps(args)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    restored = json.loads(proc.stdout.strip().splitlines()[-1])
    for step, result in restored.items():
        assert result["mode"] == "exact"
        assert full[:int(step)] + result["keys"] == full, f"stopped at step {step}"


def test_restore_reads_only_what_is_left(shard_sets, monkeypatch):
    """No replay: after a restore the decoder sees only the utterances not yet handed over."""
    from shardkit.training import reader

    calls = []
    real = reader.DECODERS["shardkit"]
    monkeypatch.setitem(reader.DECODERS, "shardkit", lambda data, dtype: calls.append(1) or real(data, dtype))
    dataset = ShardDataset(shard_sets["zst"], seed=SEED, rank=0, world_size=1)
    loader = _loader(dataset, 0)
    it = iter(loader)
    for _ in range(10):
        next(it)
    saved = loader.state_dict()
    calls.clear()
    fresh = ShardDataset(shard_sets["zst"], seed=SEED, rank=0, world_size=1)
    loader2 = _loader(fresh, 0)
    loader2.load_state_dict(saved)
    rest = [k for b in loader2 for k in b["key"]]
    assert len(rest) == len(shard_sets["keys"]) - 10 * BATCH
    assert len(calls) == len(rest)


def test_after_a_restored_epoch_the_next_is_the_normal_one(shard_sets):
    shards = shard_sets["none"]
    dataset = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    loader = _loader(dataset, 0)
    it = iter(loader)
    next(it), next(it)
    saved = loader.state_dict()
    resumed = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    loader2 = _loader(resumed, 0)
    loader2.load_state_dict(saved)
    list(loader2)
    resumed.set_epoch(1)
    again = [k for b in _loader(resumed, 0) for k in b["key"]]
    reference = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    reference.set_epoch(1)
    assert again == [k for b in _loader(reference, 0) for k in b["key"]]


def _run_ranks(shards, world, workers, stop, restore_from=None):
    """Simulated ranks (rank/world_size arguments, no process group): each reads ``stop`` batches
    (all of them when None) and saves its loader state. Returns (keys read, states, modes)."""
    read, states, modes = [], [], []
    for rank in range(world):
        dataset = ShardDataset(shards, seed=SEED, rank=rank, world_size=world)
        loader = StatefulDataLoader(dataset, batch_size=2, num_workers=workers, collate_fn=collate_padded)
        if restore_from is not None:
            modes.append(resume_state.restore_loader_state(loader, dataset, restore_from))
        it = iter(loader)
        for step, batch in enumerate(it):
            read.extend(batch["key"])
            if stop is not None and step + 1 == stop:
                break
        states.append(loader.state_dict())
        del it
    return read, states, modes


def _assert_exactly_once(read, keys):
    doubled = [k for k, n in collections.Counter(read).items() if n > 1]
    assert not doubled, f"read twice: {doubled[:5]}"
    assert sorted(read) == keys


@pytest.mark.parametrize("codec", ["none", "zst"])
def test_elastic_4x2_to_2x2_then_to_4x1(shard_sets, codec):
    shards = shard_sets[codec]
    before, states, _ = _run_ranks(shards, 4, 2, stop=2)
    middle, states2, modes = _run_ranks(shards, 2, 2, stop=3, restore_from=states)
    assert modes == ["elastic", "elastic"]
    after, _, modes = _run_ranks(shards, 4, 1, stop=None, restore_from=states2)
    assert modes == ["elastic"] * 4
    _assert_exactly_once(before + middle + after, shard_sets["keys"])


def test_elastic_2x2_to_4x1(shard_sets):
    shards = shard_sets["bz2"]
    before, states, _ = _run_ranks(shards, 2, 2, stop=3)
    after, _, modes = _run_ranks(shards, 4, 1, stop=None, restore_from=states)
    assert modes == ["elastic"] * 4
    _assert_exactly_once(before + after, shard_sets["keys"])


def test_same_topology_restore_of_ranks_is_exact(shard_sets):
    """2 ranks x 2 workers -> 2 x 2: each rank continues exactly its own sequence."""
    shards = shard_sets["none"]
    full = [_run_ranks(shards, 2, 2, stop=None)[0]]
    before, states, _ = _run_ranks(shards, 2, 2, stop=2)
    after, _, modes = _run_ranks(shards, 2, 2, stop=None, restore_from=states)
    assert modes == ["exact", "exact"]
    _assert_exactly_once(before + after, shard_sets["keys"])
    assert sorted(before + after) == sorted(full[0])


def test_elastic_deal_keeps_ranks_within_one_shard():
    weights = [100.0] * 9 + [40.0, 70.0, 5.0]
    for world, workers in [(1, 1), (2, 2), (3, 1), (4, 2), (5, 3)]:
        deal = deal_remaining(weights, world, workers)
        assert sorted(i for c in deal for i in c) == list(range(len(weights)))
        loads = rank_loads(weights, deal, world)
        assert max(loads) - min(loads) <= max(weights)
        assert all(c == sorted(c) for c in deal)  # each consumer keeps the old reading order


def test_merge_refuses_an_incomplete_run(shard_sets):
    shards = shard_sets["none"]
    _, states, _ = _run_ranks(shards, 2, 0, stop=1)
    with pytest.raises(resume_state.StateMismatchError, match=r"each \(rank, worker\) once; missing \[\(1, 0\)\]"):
        resume_state.merge(states[:1])


def test_a_state_of_another_list_seed_or_shard_set_is_refused(shard_sets, tmp_path):
    shards = shard_sets["none"]
    loader = _loader(ShardDataset(shards, seed=SEED, rank=0, world_size=1), 0)
    next(iter(loader))
    saved = loader.state_dict()["dataset_state"]
    with pytest.raises(resume_state.StateMismatchError, match="list of 12 shards, this dataset has 11"):
        ShardDataset(shards[:-1], seed=SEED).load_state_dict(saved)
    with pytest.raises(resume_state.StateMismatchError, match="another shard list"):
        ShardDataset(list(reversed(shards)), seed=SEED).load_state_dict(saved)
    with pytest.raises(resume_state.StateMismatchError, match="seed=7 shuffle=True, this dataset has seed=8"):
        ShardDataset(shards, seed=8).load_state_dict(saved)
    data_list = tmp_path / "data.list"
    data_list.write_text("".join(p + "\n" for p in shards))
    ShardDataset(str(data_list), seed=SEED).load_state_dict(saved)  # the same shards through a data.list
    st = os.stat(shards[0])
    os.utime(shards[0], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # rewritten since the save
    try:
        with pytest.raises(resume_state.StateMismatchError, match="modification times"):
            ShardDataset(str(data_list), seed=SEED).load_state_dict(saved)
    finally:
        os.utime(shards[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(resume_state.StateMismatchError, match="not a ShardDataset state"):
        ShardDataset(shards, seed=SEED).load_state_dict({"epoch": 0})


def test_a_consumer_state_under_another_topology_is_refused(shard_sets):
    shards = shard_sets["none"]
    dataset = ShardDataset(shards, seed=SEED, rank=1, world_size=2)
    loader = _loader(dataset, 0)
    next(iter(loader))
    other = ShardDataset(shards, seed=SEED, rank=0, world_size=2)
    other.load_state_dict(loader.state_dict()["dataset_state"])
    with pytest.raises(resume_state.StateMismatchError, match="rank 1 of 2, worker 0 of 1; this reader is rank 0"):
        next(iter(other))


@pytest.mark.parametrize("codec", ["none", "zst", "bz2", "gz"])
def test_reader_resumes_at_every_utterance(make_shards, codec):
    shards = make_shards(codec)
    position, marks, keys = ReadPosition(), [], []
    for sample in iter_samples(shards, position=position, decode=False):
        keys.append(sample["key"])
        marks.append((position.index, position.utt_end, position.finished))
    for n, (index, offset, finished) in enumerate(marks, 1):
        index, offset = (index + 1, 0) if finished else (index, offset)
        rest = [s["key"] for s in iter_samples(shards[index:], start=offset, decode=False)]
        assert keys[:n] + rest == keys


def test_reader_positions_through_long_names(tmp_path):
    """Members the strict parser reads (pax long names) keep exact resume offsets too."""
    utts = corpus()[:4]
    path = tmp_path / "long.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for i, (key, text, audio, _) in enumerate(utts):
            name = ("long-" * 30 if i % 2 else "") + key.replace("/", "-")
            for ext, data in (("txt", text.encode()), ("wav", audio)):
                import io

                info = tarfile.TarInfo(f"{name}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    position, marks, keys = ReadPosition(), [], []
    for sample in iter_samples(str(path), position=position, decode=False):
        keys.append(sample["key"])
        marks.append(position.utt_end)
    for n, offset in enumerate(marks[:-1], 1):
        assert keys[:n] + [s["key"] for s in iter_samples([str(path)], start=offset, decode=False)] == keys


def test_a_resume_offset_past_the_end_is_an_error(make_shards):
    from shardkit.errors import TarFormatError

    for codec in ("none", "zst"):
        shard = make_shards(codec)[0]
        with pytest.raises(TarFormatError, match="past the end"):
            list(iter_samples([shard], start=512 * 100000, decode=False))


@pytest.mark.parametrize("codec", ["none", "zst"])
def test_webdataset_stage_resumes_where_it_stood(shard_sets, codec):
    from shardkit.training.wds import tarfile_to_samples

    urls = shard_sets[codec][:4]
    stage = tarfile_to_samples()
    keys, states = [], []
    for sample in stage(iter(urls)):
        keys.append(sample["__key__"])
        states.append(stage.state_dict())
    assert len(keys) == 16
    for n, saved in enumerate(states, 1):
        again = tarfile_to_samples()
        again.load_state_dict(saved)
        assert keys[:n] + [s["__key__"] for s in again(iter(urls))] == keys
    moved = tarfile_to_samples()
    moved.load_state_dict(states[5])
    with pytest.raises(Exception, match="the shard order upstream changed"):
        list(moved(iter(list(reversed(urls)))))


def test_zstd_seek_table_jumps_to_the_frame(shard_sets, tmp_path, monkeypatch):
    """A zst shard in zstd's seekable format (frames listed in a table at its end, as pyzstd's
    SeekableZstdFile writes it) resumes by jumping to the frame: nothing before it is decompressed, and
    within it less than one frame."""
    pyzstd = pytest.importorskip("pyzstd")
    from shardkit.training import reader

    seekable = []
    for plain in shard_sets["none"]:
        out = str(tmp_path / (os.path.basename(plain) + ".zst"))
        with open(plain, "rb") as src, pyzstd.SeekableZstdFile(out, "w", level_or_option=3,
                                                               max_frame_content_size=16384) as dst:
            dst.write(src.read())
        seekable.append(out)
    assert pyzstd.SeekableZstdFile.is_seekable_format_file(seekable[0])

    real_skip = reader._skip_to

    def skip_within_the_frame(source, n, path):
        assert n < 16384, f"skipped {n} bytes by decompressing instead of using the seek table"
        real_skip(source, n, path)

    monkeypatch.setattr(reader, "_skip_to", skip_within_the_frame)
    position, marks, keys = ReadPosition(), [], []
    for sample in iter_samples(seekable[:3], position=position, decode=False):
        keys.append(sample["key"])
        marks.append((position.index, position.utt_end, position.finished))
    for n, (index, offset, finished) in enumerate(marks, 1):
        index, offset = (index + 1, 0) if finished else (index, offset)
        assert keys[:n] + [s["key"] for s in iter_samples(seekable[index:3], start=offset, decode=False)] == keys
    with pytest.raises(Exception, match="past the end"):
        list(iter_samples(seekable[:1], start=512 * 100000, decode=False))
    dataset = ShardDataset(seekable, seed=SEED, rank=0, world_size=1)
    loader = _loader(dataset, 0)
    full = [b["key"] for b in loader]
    loader = _loader(ShardDataset(seekable, seed=SEED, rank=0, world_size=1), 0)
    it = iter(loader)
    before = [next(it)["key"] for _ in range(9)]
    resumed = _loader(ShardDataset(seekable, seed=SEED, rank=0, world_size=1), 0)
    resumed.load_state_dict(loader.state_dict())
    assert before + [b["key"] for b in resumed] == full


def test_exact_restore_needs_only_this_ranks_state(shard_sets):
    shards = shard_sets["zst"]
    full = [k for b in _loader(ShardDataset(shards, seed=SEED, rank=1, world_size=2), 0) for k in b["key"]]
    loader = _loader(ShardDataset(shards, seed=SEED, rank=1, world_size=2), 0)
    it = iter(loader)
    before = [k for _ in range(2) for k in next(it)["key"]]
    saved = loader.state_dict()
    dataset = ShardDataset(shards, seed=SEED, rank=1, world_size=2)
    resumed = _loader(dataset, 0)
    assert resume_state.restore_loader_state(resumed, dataset, [saved]) == "exact"
    assert before + [k for b in resumed for k in b["key"]] == full


# Two real ranks (torch.distributed, gloo): each reads two batches, gather_loader_state() collects both loader
# states with all_gather_object, rank 0 saves them.
DISTRIBUTED = r"""
import json, os, sys, torch, torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader
from shardkit import ShardDataset, collate_padded, gather_loader_state
args = json.loads(sys.argv[1])
dist.init_process_group("gloo")
dataset = ShardDataset(args["shards"], seed=args["seed"])  # rank and world size from the process group
loader = StatefulDataLoader(dataset, batch_size=2, num_workers=1, collate_fn=collate_padded)
it = iter(loader)
keys = [k for _ in range(2) for k in next(it)["key"]]
states = gather_loader_state(loader)
if dist.get_rank() == 0:
    torch.save({"epoch": 0, "loader": states}, args["out"])
print(json.dumps(keys))
dist.destroy_process_group()
"""


def test_gather_under_torch_distributed_then_restore_on_one_rank(shard_sets, tmp_path):
    from support import free_port

    shards, out = shard_sets["zst"], str(tmp_path / "ckpt.pt")
    args = json.dumps({"shards": shards, "seed": SEED, "out": out})
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
        procs.append(subprocess.Popen([sys.executable, "-c", DISTRIBUTED, args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    read = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        read.extend(json.loads(stdout.strip().splitlines()[-1]))
    assert len(read) == 8
    checkpoint = torch.load(out, weights_only=True)
    assert len(checkpoint["loader"]) == 2
    dataset = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    loader = _loader(dataset, 0)
    assert resume_state.restore_loader_state(loader, dataset, checkpoint["loader"]) == "elastic"
    _assert_exactly_once(read + [k for b in loader for k in b["key"]], shard_sets["keys"])


def test_restore_in_the_second_epoch_of_persistent_workers(shard_sets):
    """Persistent workers count their iterations as epochs; a state saved in the second names epoch 1."""
    shards = shard_sets["none"]

    def make():
        return StatefulDataLoader(ShardDataset(shards, seed=SEED, rank=0, world_size=1), batch_size=BATCH,
                                  num_workers=2, persistent_workers=True, collate_fn=collate_padded)

    loader = make()
    list(loader)
    it = iter(loader)
    before = [next(it)["key"] for _ in range(3)]
    saved = loader.state_dict()
    rest_of_epoch1 = [b["key"] for b in it]
    consumers = resume_state.consumer_states(saved)
    assert {c["epoch"] for c in consumers} == {1}
    restored = make()
    restored.load_state_dict(saved)
    assert [b["key"] for b in restored] == rest_of_epoch1
    reference = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    reference.set_epoch(1)
    expected = [b["key"] for b in StatefulDataLoader(reference, batch_size=BATCH, num_workers=2,
                                                     collate_fn=collate_padded)]
    assert before + rest_of_epoch1 == expected


def test_plain_dataloader_in_process_restores_exactly_from_the_dataset_state(shard_sets):
    """Without torchdata: a torch DataLoader reading in the training process (num_workers=0)."""
    from torch.utils.data import DataLoader

    shards = shard_sets["bz2"]
    dataset = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    it = iter(DataLoader(dataset, batch_size=BATCH, collate_fn=collate_padded))
    before = [next(it)["key"] for _ in range(4)]
    saved = dataset.state_dict()
    rest = [b["key"] for b in it]
    fresh = ShardDataset(shards, seed=SEED, rank=0, world_size=1)
    loader = DataLoader(fresh, batch_size=BATCH, collate_fn=collate_padded)
    assert resume_state.restore_loader_state(loader, fresh, [saved]) == "exact"
    assert [b["key"] for b in loader] == rest
    assert len(before) == 4
