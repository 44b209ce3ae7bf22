"""--wenet-conf reads the index once: balance's load_columns collects the filter's columns (frames,
sample_rate, text_chars, the .txt member's place) in its one read, and plan's index_columns reads
Parquet column by column. Checked against the per-record reading (the reference: one dict per row)
on generated indexes in both forms, and end to end on real shards with a units file."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from support import SMALL_CORPORA, corpus
from test_wenet_conf import wenet_filter

from shardkit.cli import main
from shardkit.commands.balance.columns import load_columns
from shardkit.errors import ShardkitError
from shardkit.io import indexfile
from shardkit.io.synth import write_shards
from shardkit.wenet_conf.columns import ColumnCollector, index_columns

pytest.importorskip("yaml")
pytest.importorskip("pyarrow")


def _records(n=700, shards=23, seed=3, corpus_name="c"):
    """Index records shaped like `shardkit index`'s, with the odd cases a reader must keep: rows without a
    corpus (the shard's folder names it), a .txt member after the audio, a member name that does not
    start with its key (stored whole in Parquet), float frames in JSON, three sample rates."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(n):
        rate = int(rng.choice([16000, 8000, 44100]))
        frames = int(rng.uniform(0.05, 25) * rate)
        shard = f"/data/{corpus_name}-dir{u % 2}/shards_{int(rng.integers(shards)):04d}.tar"
        key = f"{corpus_name}/u{u:05d}"
        txt = [key + ".txt", 1024 * u, 5 + u % 17]
        audio = [key + ".wav", 1024 * u + 512, 44 + 2 * frames]
        members = [audio, txt] if u % 7 == 0 else [txt, audio]
        if u % 11 == 0:
            members = [["other/" + key + ".txt", 3, 4], *members]  # not its .txt; stored whole behind a NUL
        record = {"shard": shard, "key": key, "duration": frames / rate, "frames": frames, "sample_rate": rate,
                  "text_chars": int(rng.integers(0, 300)), "members": members}
        if u % 5:
            record["corpus"] = f"{corpus_name}{u % 3}"
        out.append(record)
    return out


def _write_both(tmp_path, records, name="index", group_rows=100, monkeypatch=None):
    """The records as a JSON lines index and as a Parquet index of several row groups."""
    jsonl = tmp_path / f"{name}.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    parquet = tmp_path / f"{name}.parquet"
    monkeypatch.setattr(indexfile, "ROW_GROUP_ROWS", group_rows)
    monkeypatch.setattr(indexfile, "BATCH_ROWS", min(group_rows, indexfile.BATCH_ROWS))
    with open(parquet, "wb") as f:
        indexfile.convert_index(str(jsonl), f)
    monkeypatch.undo()
    import pyarrow.parquet as pq

    assert pq.ParquetFile(parquet).num_row_groups > 1
    return str(jsonl), str(parquet)


def _reference(paths, want_txt, keep=None):
    """What index_columns gave before it read Parquet columnar: one record dict per row."""
    cols = ColumnCollector(want_txt)
    for path in paths:
        for number, record in enumerate(indexfile.iter_index(path), 1):
            if keep is None or record["shard"] in keep:
                cols.add(record, path, number)
    return cols.columns()


def _assert_same(a, b):
    assert a.shards == b.shards and a.keys == b.keys and a.corpus_names == b.corpus_names
    for field in ("shard", "corpus", "samples", "rate", "seconds", "text_chars"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y), field
    assert (a.txt is None) == (b.txt is None)
    if a.txt is not None:
        assert a.txt.dtype == b.txt.dtype and np.array_equal(a.txt, b.txt)


@pytest.mark.parametrize("want_txt", [False, True])
@pytest.mark.parametrize("subset", [False, True])
def test_index_columns_are_the_same_from_jsonl_and_parquet(tmp_path, monkeypatch, want_txt, subset):
    records = _records()
    jsonl, parquet = _write_both(tmp_path, records, monkeypatch=monkeypatch)
    keep = {r["shard"] for r in records[::3]} if subset else None
    from_jsonl = index_columns([jsonl], want_txt=want_txt, keep=keep)
    from_parquet = index_columns([parquet], want_txt=want_txt, keep=keep)
    _assert_same(from_jsonl, from_parquet)
    _assert_same(from_parquet, _reference([parquet], want_txt, keep))
    expected = [r for r in records if keep is None or r["shard"] in keep]
    assert from_parquet.keys == [r["key"] for r in expected]
    assert from_parquet.samples.tolist() == [r["frames"] for r in expected]
    assert "c1" in from_parquet.corpus_names and "c-dir0" in from_parquet.corpus_names  # folder of corpus-less rows
    if want_txt:
        places = [next((m[1], m[2]) for m in r["members"] if m[0] == r["key"] + ".txt") for r in expected]
        assert [tuple(t) for t in from_parquet.txt.tolist()] == places


def test_index_columns_of_mixed_forms_number_shards_and_corpora_in_order_of_first_appearance(tmp_path, monkeypatch):
    a, b = _records(300, seed=1, corpus_name="a"), _records(300, seed=2, corpus_name="b")
    a_jsonl, a_parquet = _write_both(tmp_path, a, "a", monkeypatch=monkeypatch)
    b_jsonl, b_parquet = _write_both(tmp_path, b, "b", monkeypatch=monkeypatch)
    mixed = index_columns([a_parquet, b_jsonl], want_txt=True)
    _assert_same(mixed, index_columns([a_jsonl, b_jsonl], want_txt=True))
    _assert_same(mixed, index_columns([a_parquet, b_parquet], want_txt=True))
    assert mixed.shards == list(dict.fromkeys(r["shard"] for r in a + b))


def test_load_columns_collects_the_filters_columns_in_its_one_read(tmp_path, monkeypatch):
    records = _records(900)
    jsonl, parquet = _write_both(tmp_path, records, monkeypatch=monkeypatch)
    full = index_columns([jsonl], want_txt=True)
    for path in (jsonl, parquet):
        mix = load_columns(["x"], [[path]], trainer_columns=True, txt_members=True)
        block = mix.corpora[0].trainer
        assert np.array_equal(block.frames, full.samples) and np.array_equal(block.rate, full.rate)
        assert np.array_equal(block.text_chars, full.text_chars) and np.array_equal(block.txt, full.txt)
        assert block.problem is None
        # compact: frames int32, rates and transcript lengths uint16 (they fit)
        assert (block.frames.dtype, block.rate.dtype, block.text_chars.dtype) == (np.int32, np.uint16, np.uint16)
        assert load_columns(["x"], [[path]]).corpora[0].trainer is None  # only when asked
        no_txt = load_columns(["x"], [[path]], trainer_columns=True).corpora[0].trainer
        assert no_txt.txt is None and np.array_equal(no_txt.frames, full.samples)


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_load_columns_keeps_the_parts_rows_of_the_filters_columns(tmp_path, monkeypatch, form):
    """--part: the filter's columns are those of the part's rows, exactly as its durations are, over
    several index files of one corpus (the part counts rows across them)."""
    first, second = _records(250, seed=5, corpus_name="p"), _records(333, seed=6, corpus_name="q")
    files = [_write_both(tmp_path, recs, name, monkeypatch=monkeypatch)[form == "parquet"]
             for recs, name in ((first, "one"), (second, "two"))]
    records = first + second
    for part in ((1, 3), (3, 3), (2, 4)):
        corpus_columns = load_columns(["x"], [files], part=part, trainer_columns=True, txt_members=True).corpora[0]
        rows = [i for i in range(len(records)) if i % part[1] == part[0] - 1]
        assert corpus_columns.durations.tolist() == [records[i]["duration"] for i in rows]
        block = corpus_columns.trainer
        assert block.frames.tolist() == [records[i]["frames"] for i in rows]
        assert block.rate.tolist() == [records[i]["sample_rate"] for i in rows]
        assert block.text_chars.tolist() == [records[i]["text_chars"] for i in rows]
        assert block.txt[:, 1].tolist() == [next(m[2] for m in records[i]["members"]
                                                 if m[0] == records[i]["key"] + ".txt") for i in rows]


def test_frames_beyond_int32_keep_int64(tmp_path, monkeypatch):
    records = _records(50)
    records[7]["frames"] = 3_000_000_000
    records[9]["sample_rate"] = 96000
    jsonl, parquet = _write_both(tmp_path, records, group_rows=20, monkeypatch=monkeypatch)
    for path in (jsonl, parquet):
        block = load_columns(["x"], [[path]], trainer_columns=True).corpora[0].trainer
        assert block.frames.dtype == np.int64 and int(block.frames[7]) == 3_000_000_000
        assert block.rate.dtype == np.int32 and int(block.rate[9]) == 96000


def _conf(tmp_path, filter_conf, batch="{batch_type: static, batch_size: 4}"):
    path = tmp_path / "train.yaml"
    path.write_text(f"dataset_conf:\n  filter_conf: {filter_conf}\n  batch_conf: {batch}\n")
    return str(path)


def _balance_dry_run(corpora, tmp_path, *extra, out="o"):
    args = ["balance", *[a for c in corpora for a in ("--corpus", c)], "--world-size", "2", "--num-workers", "2",
            "--shard-duration", "120", "-o", str(tmp_path / out), "--dry-run", "--json", "-q", "-j", "1", *extra]
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_balance_with_wenet_conf_reads_each_index_once(tmp_path, monkeypatch, form):
    """Every index file is opened (JSON lines) or every row group read (Parquet) once for the filter's
    columns: no second pass over the index, and no per-row dicts of a Parquet index."""
    from shardkit.wenet_conf import columns, list_view

    files = [_write_both(tmp_path, _records(400, seed=s, corpus_name=n), n, monkeypatch=monkeypatch)[form == "parquet"]
             for s, n in ((1, "a"), (2, "b"))]
    conf = _conf(tmp_path, "{max_length: 1500, min_length: 20, token_max_length: 250}")
    opened, groups = [], []
    open_index, read_row_group = indexfile.open_index, indexfile.read_row_group
    monkeypatch.setattr(indexfile, "open_index", lambda path: opened.append(path) or open_index(path))

    def counted_group(pf, path, group, columns, **how):
        if "frames" in columns:
            groups.append((path, group))
        return read_row_group(pf, path, group, columns, **how)

    monkeypatch.setattr(indexfile, "read_row_group", counted_group)
    monkeypatch.setattr(indexfile, "iter_parquet_records", lambda *a, **k: pytest.fail("a per-row read"))
    for module in (columns, list_view):
        monkeypatch.setattr(module, "index_columns", lambda *a, **k: pytest.fail("a second read of the index"))
    dropped = tmp_path / "dropped.txt"
    result = _balance_dry_run([f"a={files[0]}", f"b={files[1]}"], tmp_path, "--wenet-conf", conf,
                      "--dropped-keys", str(dropped))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["wenet_conf"]["filter"]["dropped_utterances"] == len(dropped.read_text().split()) > 0
    if form == "jsonl":
        assert sorted(opened) == sorted(files)
    else:
        import pyarrow.parquet as pq

        expected = [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]
        assert sorted(groups) == sorted(expected) and not opened


def test_balance_reports_the_same_from_both_forms_and_after_the_index_is_gone(tmp_path, monkeypatch):
    """JSON lines and Parquet give one report; the filter needs nothing of the index once it is loaded
    (a conf that drops nothing reads no key back), so the files can be gone by then."""
    from shardkit.commands.balance.columns import load_columns as real_load
    from shardkit.wenet_conf.load import load_spec
    from shardkit.wenet_conf.mix import filter_mix

    records = _records(600)
    jsonl, parquet = _write_both(tmp_path, records, monkeypatch=monkeypatch)
    conf = _conf(tmp_path, "{max_length: 1800, min_length: 30, token_max_length: 260}")
    docs = []
    for path in (jsonl, parquet):
        dropped = tmp_path / f"dropped-{os.path.basename(path)}.txt"
        result = _balance_dry_run([f"c={path}"], tmp_path, "--wenet-conf", conf, "--dropped-keys", str(dropped))
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        doc.pop("elapsed_seconds")
        docs.append((doc, dropped.read_text()))
    assert docs[0] == docs[1]
    gone = [r["key"] for r in records if not wenet_filter(r["frames"], r["sample_rate"], r["text_chars"],
                                                          max_length=1800, min_length=30, token_max_length=260)]
    assert sorted(docs[0][1].split()) == sorted(gone)

    keep_all = load_spec(_conf(tmp_path, "{max_length: 100000, min_length: 0, token_max_length: 100000, "
                                         "token_min_length: 0, min_output_input_ratio: 0, "
                                         "max_output_input_ratio: 100000}"))
    for path in (jsonl, parquet):
        mix = real_load(["c"], [[path]], trainer_columns=True)
        os.rename(path, path + ".gone")
        try:
            filtered, facts = filter_mix(mix, keep_all)
        finally:
            os.rename(path + ".gone", path)
        assert facts.result.summary["dropped_utterances"] == 0 and len(filtered.corpora[0].durations) == len(records)
        assert filtered.corpora[0].trainer is None  # the columns go once the filter has used them
        assert facts.samples[0].tolist() == [r["frames"] for r in records]


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
@pytest.mark.parametrize("case", ["no_frames", "no_txt"])
def test_a_record_the_filter_cannot_use_is_an_error_naming_file_and_row(tmp_path, monkeypatch, form, case):
    records = _records(120)
    if case == "no_frames":
        del records[42]["text_chars"]
    else:
        records[42]["members"] = [m for m in records[42]["members"] if not m[0].endswith(".txt")]
    jsonl, parquet = _write_both(tmp_path, records, group_rows=30, monkeypatch=monkeypatch)
    path = parquet if form == "parquet" else jsonl
    conf = _conf(tmp_path, "{min_length: 0}")
    extra = []
    if case == "no_txt":
        units = tmp_path / "units.txt"
        units.write_text("<blank> 0\n<unk> 1\n")
        extra = ["--tokenizer", str(units)]
    where = f"{path}: row 42" if form == "parquet" else f"{path}: line 43"
    why = ("lacks frames, sample_rate or text_chars" if case == "no_frames" else "names no .txt member")
    expected = f"{where}: index record of {records[42]['key']!r} {why}"
    result = _balance_dry_run([f"c={path}"], tmp_path, "--wenet-conf", conf, *extra)
    assert result.exit_code == 1, result.output
    assert expected in result.stderr and "Traceback" not in result.output
    listing = tmp_path / "data.list"
    listing.write_text("".join(sorted({r["shard"] + "\n" for r in records})))
    result = CliRunner().invoke(main, ["plan", str(listing), "--index", path, "--world-size", "1", "--num-workers",
                                       "1", "--wenet-conf", conf, "-q", *extra])
    assert result.exit_code == 1, result.output
    assert expected in result.stderr and "Traceback" not in result.output


def test_balance_with_a_units_file_from_a_jsonl_and_a_parquet_index_of_real_shards(tmp_path):
    """Token counts from the shards' transcripts at the places the index gives (the .txt members'), both forms."""
    write_shards(corpus(SMALL_CORPORA), str(tmp_path / "src"), utts_per_shard=4, codec="zst")
    texts = {key: text for key, text, _, _ in corpus(SMALL_CORPORA)}
    units = tmp_path / "units.txt"
    chars = sorted({ch for t in texts.values() for ch in t if ch != " "})
    units.write_text("".join(f"{c} {i}\n" for i, c in enumerate(["<blank>", "<unk>", "▁"] + chars)))
    conf = _conf(tmp_path, "{token_max_length: 12, min_length: 0}")
    docs = []
    for suffix in ("jsonl", "parquet"):
        index = tmp_path / f"index.{suffix}"
        made = CliRunner().invoke(main, ["index", str(tmp_path / "src"), "-o", str(index), "-j", "1", "-q"])
        assert made.exit_code == 0, made.output
        dropped = tmp_path / f"dropped-{suffix}.txt"
        result = _balance_dry_run([f"mix={index}"], tmp_path, "--wenet-conf", conf, "--tokenizer", str(units),
                          "--dropped-keys", str(dropped))
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        doc.pop("elapsed_seconds")
        docs.append((doc, dropped.read_text().split()))
    expected = sorted(k for k, t in texts.items() if len(t.strip()) > 12)
    assert expected and sorted(docs[0][1]) == expected
    assert docs[0] == docs[1]


def test_a_parquet_index_with_a_null_shard_is_an_error_naming_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = _records(10)
    batch = indexfile.records_to_batch(records)
    shard = batch.column(batch.schema.get_field_index("shard")).to_pylist()
    shard[4] = None
    batch = batch.set_column(batch.schema.get_field_index("shard"), "shard",
                             pa.array(shard, pa.string()).dictionary_encode())
    path = tmp_path / "index.parquet"
    pq.write_table(pa.Table.from_batches([batch]), path)
    with pytest.raises(ShardkitError, match=r"row group 0: a null shard") as err:
        index_columns([str(path)], want_txt=False)
    assert str(path) in str(err.value)


def test_parts_with_wenet_conf_drop_together_what_one_piece_drops(tmp_path, monkeypatch):
    """--part with --wenet-conf: each part filters its own rows (the filter's columns are read for the part's
    rows only), so the parts' dropped keys, and their kept utterances, add up to the one-piece run's."""
    records = _records(900, seed=4)
    _, parquet = _write_both(tmp_path, records, monkeypatch=monkeypatch)
    conf = _conf(tmp_path, "{max_length: 1500, min_length: 20, token_max_length: 250}")
    runs = []
    for part in (None, "1/3", "2/3", "3/3"):
        dropped = tmp_path / f"dropped-{part and part[0]}.txt"
        extra = ("--part", part) if part else ()
        result = _balance_dry_run([f"c={parquet}"], tmp_path, "--wenet-conf", conf, "--dropped-keys", str(dropped), *extra,
                          out=f"o{part and part[0]}")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["balanced"] and ("part" in doc) == bool(part)
        runs.append((doc, dropped.read_text().split()))
    whole, parts = runs[0], runs[1:]
    assert sorted(k for _, keys in parts for k in keys) == sorted(whole[1]) and whole[1]
    for field in ("utterances", "dropped_utterances"):
        counts = [d["wenet_conf"]["filter"][field] for d, _ in runs]
        assert sum(counts[1:]) == counts[0], field
    for i, (_, keys) in enumerate(parts):  # a part drops only its own rows (row i modulo 3)
        mine = {r["key"] for r in records[i::3]}
        assert set(keys) <= mine
