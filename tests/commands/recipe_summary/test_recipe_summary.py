"""shardkit.commands.recipe_summary: the list's own format read from real shards, and the loader advice
for that format and the training node (pure). The summary end to end is in tests/test_recipe.py."""

from __future__ import annotations

import re

import pytest

from shardkit.commands.recipe_summary import ListFormat, RecipeSettings, advise, evidence_lines, list_decode_rate, \
    list_format
from support import tar_bytes

# bench rows as the summary takes them from bench.json (h/s of audio read + decoded per core)
ROWS = [{"format": "none", "codec": "none", "audio": "wav", "size_ratio": 1.0, "hours_per_s": 20.0},
        {"format": "none", "codec": "none", "audio": "flac", "size_ratio": 0.66, "hours_per_s": 1.0},
        {"format": "zst:3", "codec": "zst", "audio": "wav", "size_ratio": 0.82, "hours_per_s": 5.0}]
RERUN = "bash run.sh --workdir /w --stage 2 --num_workers NUM_WORKERS"


@pytest.mark.parametrize("codec,audio", [("none", "wav"), ("bz2", "flac"), ("zst", "wav")])
def test_list_format_reads_the_codec_and_the_audio_members_of_the_first_shard(make_shards, codec, audio):
    shards = make_shards(codec, audio_format=audio, utts_per_shard=4)
    fmt = list_format(shards[0])
    assert (fmt.codec, fmt.audio) == (codec, {audio: 1.0})
    assert fmt.label == {"none": "plain tar", "bz2": "bz2 tar", "zst": "zst tar"}[codec] + f", {audio.upper()} members"


def test_list_format_of_a_mixed_shard_gives_each_kind_its_share(tmp_path):
    members = [(f"k{i}.txt", b"text") for i in range(4)]
    members = [m for i, txt in enumerate(members) for m in (txt, (f"k{i}.{'flac' if i == 3 else 'wav'}", b"\0" * 700))]
    shard = tmp_path / "mixed.tar"
    shard.write_bytes(tar_bytes(members))
    fmt = list_format(str(shard))
    assert fmt.audio == {"wav": 0.75, "flac": 0.25}
    assert fmt.label == "plain tar, WAV 75%, FLAC 25% members"
    assert list_format(str(tmp_path / "missing.tar")) is None
    (tmp_path / "cut.tar").write_bytes(tar_bytes(members)[:1500])  # truncated: unreadable, said, not raised
    assert list_format(str(tmp_path / "cut.tar")) is None


def test_only_the_rows_of_the_lists_own_format_are_marked_and_rated():
    wav = ListFormat("s.tar", "none", {"wav": 1.0})
    lines = evidence_lines(ROWS, wav)
    assert [line.endswith("<- this list") for line in lines] == [True, False, False]
    assert list_decode_rate(ROWS, wav) == (20.0, "none WAV shards of the training list", [])
    mixed = ListFormat("s.tar", "none", {"wav": 0.5, "flac": 0.5})
    assert [line.endswith("<- this list") for line in evidence_lines(ROWS, mixed)] == [True, True, False]
    rate, on, missing = list_decode_rate(ROWS, mixed)
    assert rate == pytest.approx(1 / (0.5 / 20 + 0.5 / 1.0)) and not missing  # core-seconds add up per share
    assert on == ("none WAV shards of the training list (50% of its members) and none FLAC shards of the "
                  "training list (50% of its members)")
    zst_flac = ListFormat("s.tar.zst", "zst", {"flac": 1.0})
    assert list_decode_rate(ROWS, zst_flac) == (None, "nothing", ["flac"])  # not measured: said, not guessed
    assert not any(line.endswith("<- this list") for line in evidence_lines(ROWS, zst_flac))



def test_a_list_of_one_audio_kind_is_rated_exactly_as_its_bench_row():
    # 1 / (1.0 / 3.9346) is 3.9345999999999997: a one-kind list takes its row's figure as measured
    rows = [{**ROWS[0], "hours_per_s": 3.9346}]
    assert list_decode_rate(rows, ListFormat("s.tar", "none", {"wav": 1.0}))[0] == 3.9346

def test_advice_without_the_training_nodes_cores_gives_what_one_gpu_needs_and_the_rerun():
    settings = RecipeSettings(num_workers=1, rerun_balance=RERUN)
    advice = advise(ROWS, ListFormat("s.tar", "none", {"wav": 1.0}), settings, this_machine_cores=2)
    # 0.42 h/s x (1/20 + 1/0.25) = 1.70 workers per GPU, whatever the node
    assert not advice["node_known"] and advice["workers_needed"] == pytest.approx(1.701, abs=1e-3)
    assert advice["num_workers"] == 2 and advice["prefetch_factor"] == 13
    assert "if the training node has at least 2 cores per GPU" in advice["text"]
    assert advice["rerun"] == "bash run.sh --workdir /w --stage 2 --num_workers 2"
    same = advise(ROWS, ListFormat("s.tar", "none", {"wav": 1.0}), RecipeSettings(num_workers=2, rerun_balance=RERUN),
                  this_machine_cores=2)
    assert "rerun" not in same and same["text"].endswith("(the --num_workers this list was balanced for)")


def test_advice_for_the_training_node_uses_its_cores_and_gpus():
    fmt = ListFormat("s.tar", "none", {"flac": 1.0})
    node = RecipeSettings(num_workers=2, train_cores=32, gpus_per_node=4, rerun_balance=RERUN)
    advice = advise(ROWS, fmt, node, this_machine_cores=2)
    # FLAC at 1 h/s: 0.42 x (1/1 + 1/0.25) = 2.1 workers -> 3, within the 8 cores each GPU has
    assert advice["node_known"] and (advice["cores"], advice["cores_per_gpu"]) == (32, 8)
    assert advice["num_workers"] == 3 and advice["rerun"].endswith("--num_workers 3")
    assert "4 GPUs per node, 32 cores (8 per GPU); read + decode 1 h/s per core measured on none FLAC" in advice["text"]
    starved = advise(ROWS, fmt, RecipeSettings(num_workers=2, train_cores=2, gpus_per_node=4, rerun_balance=RERUN),
                     this_machine_cores=2)
    assert starved["num_workers"] == 0 and "rerun" not in starved  # no list is balanced for 0 workers
    assert "fewer cores than GPUs: num_workers=0" in starved["text"]


def test_a_summary_before_prep_ran_points_to_nothing_missing(tmp_path):
    from shardkit.commands.recipe_summary import write_summary

    (tmp_path / "corpora.txt").write_text("aishell=/data/aishell\nlibri=/data/libri\n")
    summary, lines = write_summary(str(tmp_path), RecipeSettings(num_workers=2))
    assert summary["bytes_source"] is None and summary["bytes_balanced"] is None and summary["hours"] == 0
    assert summary["where"] == {"reports": str(tmp_path / "reports")}  # the one folder that exists: it wrote there
    assert "- sizes on disk: 0 source shards - -> 0 training shards -" in lines
    assert "- training list format: unknown (no readable shard in the training list)" in lines
    printed = re.findall(rf"{re.escape(str(tmp_path))}[^\s,)`]*", "\n".join(lines))
    assert printed == [str(tmp_path / "reports")]
    assert (tmp_path / "reports" / "summary.md").read_text().splitlines() == lines


def test_the_advice_lines_say_where_each_figure_of_the_node_came_from():
    from shardkit.commands.recipe_summary import _advice_lines

    guessed = RecipeSettings(num_workers=2, train_cores=4, gpus_from="a guess: torch sees no GPU here")
    advice = advise(ROWS, ListFormat("s.tar", "none", {"wav": 1.0}), guessed, this_machine_cores=2)
    summary = {"format": {"list": {"codec": "none", "audio": {"wav": 1.0}}}, "where": {}, "world_size": 2}
    lines = _advice_lines(advice, summary, guessed)
    assert lines[0].startswith("- loader advice for the training node (4 cores: --train_cores; 1 GPU per node: a "
                               "guess: torch sees no GPU here): 1 GPU per node, 4 cores (4 per GPU)")
    assert not any("to balance for" in line for line in lines)  # 2 workers advised, 2 balanced for
