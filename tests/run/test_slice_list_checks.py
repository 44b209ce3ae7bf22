"""merge-reports checks every slice's list against its own report: a list edited after its slice ran
(a line dropped, repeated, moved or changed, a shard rewritten) is refused, naming the slice and the line."""

import json

import pytest

from shardkit.io.files import load_json
from shardkit.io.indexfile import index_marks
from shardkit.io.indexmarks import stamp_file
from shardkit.run.split import list_mismatch
from support import run_cli


@pytest.mark.parametrize("found, why", [
    (["a", "b", "c"], None),
    (["a", "c"], "line 2 should be 'b' (missing from the list)"),
    (["a", "b"], "line 3 should be 'c' (the list stops at 2 lines)"),
    (["a", "b", "b", "c"], "line 3 repeats line 2 ('b')"),
    (["a", "c", "b"], "line 2 is 'c', which its report lists as line 3 (the order changed)"),
    (["a", "x", "c"], "line 2 is 'x', which its report does not list (it lists 'b' there)"),
    (["a", "b", "c", "d"], "line 4 ('d') is one more than the 3 its report lists"),
])
def test_list_mismatch_names_the_first_line_that_differs(found, why):
    assert list_mismatch(found, ["a", "b", "c"]) == why


@pytest.fixture
def sliced(make_shards, tmp_path):
    """convert over the small mix as a job array of 3 (at least 2 shards a slice), not merged yet."""
    sources = make_shards("none", utts_per_shard=2)
    out = tmp_path / "out"
    for i in (1, 2, 3):
        result = run_cli("convert", *sources, "-o", out, "-j", "1", "-q", "--split", f"{i}/3")
        assert result.exit_code == 0, result.output
    return out


def _edit(path, change):
    lines = path.read_text().splitlines()
    path.write_text("".join(f"{line}\n" for line in change(lines)))


@pytest.mark.parametrize("change, why", [
    (lambda lines: lines[:1], "line 2 should be"),
    (lambda lines: [lines[0], lines[0], lines[1]], "line 2 repeats line 1"),
    (lambda lines: lines[::-1], "(the order changed)"),
    (lambda lines: [lines[0], lines[1].replace(".tar", "-x.tar")], "which its report does not list"),
    (lambda lines: [], "line 1 should be"),
])
def test_an_edited_slice_list_is_refused_naming_the_slice_and_the_line(sliced, change, why):
    listed = sliced / "data.slice-2-of-3.list"
    _edit(listed, change)
    result = run_cli("merge-reports", sliced, "--json")
    assert result.exit_code == 1, result.output
    assert "slice 2 of 3: its list does not match its report" in result.output
    assert why in result.output and str(listed) in result.output
    assert json.loads(result.stdout)["error"]  # one JSON document, which says why
    assert not (sliced / "data.list").exists() and not (sliced / "convert.json").exists()


def test_a_shard_listed_by_two_slices_is_refused(sliced):
    """Each list agrees with its report, but the reports were edited alike: the whole would repeat a shard."""
    first = (sliced / "data.slice-1-of-3.list").read_text().splitlines()
    report = load_json(str(sliced / "convert.slice-2-of-3.json"))
    report["slice"]["list"]["lines"][0] = first[0]
    (sliced / "convert.slice-2-of-3.json").write_text(json.dumps(report))
    _edit(sliced / "data.slice-2-of-3.list", lambda lines: [first[0]] + lines[1:])
    result = run_cli("merge-reports", sliced)
    assert result.exit_code == 1
    assert f"slice 2 of 3: line 1 ('{first[0]}') is listed by slice 1 too" in result.output


def test_a_shard_rewritten_after_its_slice_is_refused(sliced):
    shard = (sliced / "data.slice-3-of-3.list").read_text().splitlines()[1]
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)
    result = run_cli("merge-reports", sliced)
    assert result.exit_code == 1
    assert f"slice 3 of 3: its list does not match its report: line 2: {shard} is" in result.output
    assert "its slice wrote" in result.output


def test_intact_slices_merge_and_the_merged_report_carries_no_slice_list(sliced):
    result = run_cli("merge-reports", sliced, "--json", "-q")
    assert result.exit_code == 0, result.output
    merged = load_json(str(sliced / "convert.json"))
    assert "slice" not in merged
    joined = "".join((sliced / f"data.slice-{i}-of-3.list").read_text() for i in (1, 2, 3))
    assert (sliced / "data.list").read_text() == joined and len(joined.splitlines()) == 7
    # the slices' by-product indexes joined: one index, whole, with every written shard's stamp
    marks = index_marks(str(sliced / "index.parquet"))
    assert marks.marked and marks.rows == 14
    assert marks.sources == {shard: stamp_file(shard) for shard in joined.splitlines()}


def test_old_slice_reports_without_a_list_still_merge(sliced):
    for i in (1, 2, 3):
        path = sliced / f"convert.slice-{i}-of-3.json"
        report = load_json(str(path))
        del report["slice"]["list"]
        path.write_text(json.dumps(report))
    assert run_cli("merge-reports", sliced).exit_code == 0


def test_balance_slice_list_reordered_is_refused(tmp_path):
    """balance --split: the list of the slice that wrote two shards, reordered after it ran."""
    from shardkit.io.synth import corpus_utterances, write_shards
    from support import SMALL_CORPORA

    spec = SMALL_CORPORA[0]
    write_shards(list(corpus_utterances(spec, seed=2)), str(tmp_path / spec.name), utts_per_shard=2, codec="none")
    out = tmp_path / "out"
    for i in (1, 2, 3):
        result = run_cli("balance", "-o", out, "--world-size", "2", "--num-workers", "1", "--num-shards", "4",
                         "-j", "1", "-q", "--corpus", f"{spec.name}={tmp_path / spec.name}", "--split", f"{i}/3")
        assert result.exit_code == 0, result.output
    listed = out / "data.slice-3-of-3.list"
    _edit(listed, lambda lines: lines[::-1])
    result = run_cli("merge-reports", out, "--command", "balance")
    assert result.exit_code == 1
    assert "slice 3 of 3: its list does not match its report: line 1 is" in result.output
    assert "(the order changed)" in result.output and not (out / "data.list").exists()
    _edit(listed, lambda lines: lines[::-1])  # put back: the merge goes through
    assert run_cli("merge-reports", out, "--command", "balance").exit_code == 0
