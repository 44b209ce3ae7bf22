"""--wenet-conf, --tokenizer and --dropped-keys: the options plan and balance share, and the spec they load."""

from __future__ import annotations

import click


def wenet_conf_options(f):
    """--wenet-conf, --tokenizer and --dropped-keys (plan and balance)."""
    f = click.option("--dropped-keys", type=click.Path(dir_okay=False), default=None,
                     help="With --wenet-conf: write the keys the trainer's filter drops to this file (one per "
                          "line, atomically).")(f)
    f = click.option("--tokenizer", type=click.Path(dir_okay=False), default=None,
                     help="With --wenet-conf: the tokenizer file instead of the conf's (a units/symbol table, or "
                          "a sentencepiece .model). Without any, one token per transcript character is assumed.")(f)
    f = click.option("--wenet-conf", type=click.Path(dir_okay=False), default=None, metavar="TRAIN.yaml",
                     help="WeNet's training conf: apply its filter_conf before planning and report what it drops, "
                          "and simulate its batching (steps per rank and worker).")(f)
    return f


def trainer_spec(wenet_conf, tokenizer, dropped_keys):
    """The loaded --wenet-conf (None without it); --tokenizer and --dropped-keys need it."""
    from shardkit.wenet_conf.load import spec_of_options

    return spec_of_options(wenet_conf, tokenizer, dropped_keys)
