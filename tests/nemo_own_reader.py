"""Run under a Python that has nemo-toolkit's ASR collection (its own environment, which scripts/test.sh
makes): NeMo's own ``TarredAudioToCharDataset`` reads a tarred dataset in ``world`` real torch.distributed
processes (gloo), each built as a trainer builds it (``global_rank``/``world_size``, the config's strategy),
through a DataLoader of ``workers`` workers and batches of ``batch``, one ``all_reduce`` per step; what each
rank got (its batches, and how many steps it took in lockstep with every other rank) is written as JSON to
``out``.

    python tests/nemo_own_reader.py nemo_config.yaml WORLD WORKERS BATCH out.json
"""

import hashlib
import json
import os
import subprocess
import sys

# nemo-toolkit[asr] is not a dependency of shardkit: it brings a second torch, lightning, hydra and transformers.
# Point SHARDKIT_NEMO_PYTHON at a Python that has it (python -m venv /tmp/nemo-venv &&
# /tmp/nemo-venv/bin/pip install 'nemo_toolkit[asr]') and the opt-in tests run NeMo's own dataset class.
NEMO_PYTHON = os.environ.get("SHARDKIT_NEMO_PYTHON")
NEEDS_NEMO = "SHARDKIT_NEMO_PYTHON (a Python with nemo-toolkit[asr]) is not set"


def read_with_nemo(config_path, world: int, workers: int, batch: int, work_dir) -> list[dict]:
    """From the test's side: run this file under NEMO_PYTHON; per rank ``{"length", "batches"}``."""
    out = os.path.join(str(work_dir), "nemo-read.json")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # NeMo's environment, not the test's
    subprocess.run([NEMO_PYTHON, os.path.abspath(__file__), str(config_path), str(world), str(workers), str(batch),
                    out], check=True, env=env, timeout=500)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


def _rank(rank: int, config_path: str, world: int, workers: int, batch: int, out: str, rendezvous: str) -> None:
    """One trainer rank: a real torch.distributed process (gloo) that builds NeMo's dataset for its
    ``global_rank`` and steps through it as DDP does, one ``all_reduce`` per step. The step loop is joined
    (each step all ranks say whether they still have a batch) so that uneven ranks are counted, not hung."""
    import torch
    import torch.distributed as dist
    import yaml
    from nemo.collections.asr.data.audio_to_text import TarredAudioToCharDataset

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    with open(config_path, encoding="utf-8") as f:
        train_ds = yaml.safe_load(f)["train_ds"]
    with open(train_ds["manifest_filepath"], encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    labels = sorted({c for line in lines for c in line["text"]})  # every character its own label: text back whole
    dataset = TarredAudioToCharDataset(train_ds["tarred_audio_filepaths"], train_ds["manifest_filepath"], labels,
                                       16000, shuffle_n=0, normalize=False, parser="base",
                                       shard_strategy=train_ds["tarred_shard_strategy"], global_rank=rank,
                                       world_size=world, return_sample_id=True)
    # fork, as under torchrun (each rank a fresh process with Linux's default); a spawned rank would hand its
    # workers spawn, and NeMo's dataset holds classes made at run time that do not pickle
    loader = iter(torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers,
                                              collate_fn=dataset.collate_fn, multiprocessing_context="fork"))
    batches, lockstep, uneven = [], 0, 0
    while True:
        got = next(loader, None)
        still = torch.tensor([0 if got is None else 1])
        dist.all_reduce(still)  # the gradient all-reduce of a DDP step, reduced to its count
        if int(still) == 0:
            break
        if int(still) < world:
            uneven += 1
        else:
            lockstep += 1
        if got is not None:
            audio, audio_len, tokens, tokens_len, sample_ids = got
            batches.append([{"line": lines[sid], "frames": int(audio_len[i]),
                             "digest": hashlib.sha256(audio[i, :audio_len[i]].numpy().astype("float32").tobytes()).hexdigest(),
                             "text": "".join(labels[t] for t in tokens[i, :tokens_len[i]].tolist())}
                            for i, sid in enumerate(sample_ids.tolist())])
    with open(f"{out}.rank{rank}", "w", encoding="utf-8") as f:
        json.dump({"rank": rank, "length": len(dataset), "batches": batches, "lockstep_steps": lockstep,
                   "uneven_steps": uneven}, f)
    dist.destroy_process_group()


def main(config_path: str, world: int, workers: int, batch: int, out: str) -> None:
    import torch.multiprocessing as mp

    rendezvous = f"{out}.rendezvous"
    if os.path.exists(rendezvous):
        os.remove(rendezvous)
    mp.start_processes(_rank, args=(config_path, world, workers, batch, out, rendezvous), nprocs=world,
                       join=True, start_method="spawn")
    ranks = []
    for rank in range(world):
        with open(f"{out}.rank{rank}", encoding="utf-8") as f:
            ranks.append(json.load(f))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(ranks, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
