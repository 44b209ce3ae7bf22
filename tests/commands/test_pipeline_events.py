"""balance and prep report through the one event protocol (stages, done, notes), and the pipelines' bars
show a note after the bar it ends and keep the shards that could not be indexed."""

from __future__ import annotations

from shardkit.cli._progress import ProgressBars
from shardkit.commands.balance import BalanceSettings, CorpusSource, run_balance
from shardkit.io.synth import CorpusSpec, corpus_utterances, write_shards
from shardkit.run.events import DONE, NOTE, STAGE, Event
from shardkit.run.options import RunOptions


def _sources(root):
    write_shards(corpus_utterances(CorpusSpec("zh", 12, 0.5, 1.5, "zh"), seed=1), str(root / "zh"), utts_per_shard=4,
                 codec="gz")
    write_shards(corpus_utterances(CorpusSpec("en", 8, 1.0, 2.0, "en"), seed=2), str(root / "en"), utts_per_shard=4)
    return [CorpusSource("zh", (str(root / "zh"),)), CorpusSource("en", (str(root / "en"),))]


def test_balance_reports_its_stages_and_notes_in_order(tmp_path):
    corpora = _sources(tmp_path)
    seen: list[Event] = []
    report = run_balance(corpora, str(tmp_path / "out"), BalanceSettings(world_size=2, num_workers=1, num_shards=4),
                         RunOptions(jobs=1, on_event=seen.append))
    assert report.exit_code == 0
    steps = [(e.kind, e.stage if e.kind == STAGE else e.text) for e in seen if e.kind != DONE]
    assert steps == [(STAGE, "index zh"), (STAGE, "index en"), (NOTE, "loading..."), (NOTE, "planning..."),
                     (STAGE, "decompress"), (STAGE, "write")]
    done = {}
    for e in seen:
        if e.kind == DONE:
            done.setdefault(e.stage, []).append(e)
    assert [len(done[s]) for s in ("index zh", "index en", "decompress", "write")] == [3, 2, 3, 4]
    assert all(e.failed is None for events in done.values() for e in events)
    assert {e.result["path"] for e in done["write"]} == {row["path"] for row in report.shards}


def test_a_note_ends_the_bar_and_unreadable_index_shards_are_kept(capsys):
    lines = []
    bars = ProgressBars(notes_end_bars=True, line_for=lambda e: lines.append(e.result) or "a line above the bar")
    bars(Event(STAGE, stage="index zh", total=2))
    bars(Event(DONE, stage="index zh", result={"shard": "/a.tar"}, error="/a.tar: truncated"))
    bars(Event(DONE, stage="index zh", result={"shard": "/b.tar"}))
    assert bars.bar is not None and [r["shard"] for r in bars.failed_results("index ")] == ["/a.tar"]
    bars(Event(NOTE, stage="index zh", text="loading..."))
    assert bars.bar is None
    bars(Event(STAGE, stage="write", total=1))
    bars(Event(DONE, stage="write", result={"path": "/o.tar", "status": "failed", "error": "/o.tar: full disk"}))
    bars.close()
    err = capsys.readouterr().err
    assert [r["shard"] for r in bars.failed_results("index ")] == ["/a.tar"] and lines == [{"shard": "/a.tar"}, {"shard": "/b.tar"}, {"path": "/o.tar",
                                                       "status": "failed", "error": "/o.tar: full disk"}]
    assert err.index("failed: /a.tar: truncated") < err.index("loading...") < err.index("failed: /o.tar: full disk")
    assert err.count("a line above the bar") == 3
    quiet = ProgressBars(quiet=True, notes_end_bars=True, line_for=lambda e: "never shown")
    quiet(Event(STAGE, stage="read+check", total=1))
    quiet(Event(DONE, stage="read+check", result={"shard": "/s.tar"}))
    quiet(Event(NOTE, text="closing and verifying 1 shards..."))
    assert capsys.readouterr().err == ""


def test_prep_reports_its_reading_and_the_closing_note(tmp_path):
    from shardkit.commands.prep import PrepSettings, run_prep
    from shardkit.commands.validate import ValidateOptions

    corpora = _sources(tmp_path)
    seen: list[Event] = []
    report = run_prep(corpora, str(tmp_path / "out"), PrepSettings(world_size=2, num_workers=1, num_shards=2),
                      ValidateOptions(), RunOptions(jobs=1, on_event=seen.append))
    assert report.exit_code == 0
    assert [(e.kind, e.stage) for e in seen if e.kind == STAGE] == [(STAGE, "read+check")]
    assert sorted(e.result["shard"] for e in seen if e.kind == DONE) == sorted(s["shard"] for s in report.sources)
    assert [e.text for e in seen if e.kind == NOTE] == ["closing and verifying 2 shards..."]
