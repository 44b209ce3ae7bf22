"""bench's workers panel says when the corpus is too small to show what workers gain (pure)."""

from __future__ import annotations

from shardkit.commands.bench import format_tables, loader_panel_note


def report(main_s, shards, workers=(0, 2)):
    rows = [{"workers": w, "mp_context": "main" if w == 0 else "fork", "median_s": main_s if w == 0 else main_s * 1.5,
             "startup_s": 0.0 if w == 0 else 0.4, "utterances_per_s": 10.0, "hours_per_s": 0.1,
             "steady_hours_per_s": 0.1, "spread": 0.0, "format": "zst:3", "audio": "wav"} for w in workers]
    return {"loader": rows, "corpus": {"shards": shards, "utterances": 8, "hours": 0.01, "wav_tar_bytes": 1e6,
                                       "source": "sampled"},
            "machine": {"cpu": "x", "cores": 2, "python": "3.11"}, "formats": [], "recommendation": {},
            "settings": {"decoders": ["shardkit"], "repeat": 1, "loader_batch_size": 16}}


def test_tiny_corpus_gets_the_note_in_table_and_chart_text():
    note = loader_panel_note(report(0.3, 2))
    assert note.startswith("corpus too small to measure what workers gain: one pass takes 0.3 s in the main "
                           "process, less than starting workers costs; 2 shards for up to 2 workers")
    assert f"Note: {note}." in format_tables(report(0.3, 2))


def test_a_corpus_big_enough_gets_no_note():
    assert loader_panel_note(report(5.0, 16)) is None
    assert loader_panel_note(report(5.0, 16, workers=(0,))) is None
    assert "Note:" not in format_tables(report(5.0, 16))
