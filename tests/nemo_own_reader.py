"""Run under a Python that has nemo-toolkit's ASR collection (its own environment; see the opt-in test in
tests/commands/balance/test_balance_layouts_ddp.py): NeMo's own ``TarredAudioToCharDataset`` reads a tarred
dataset for each rank of ``world`` as a trainer builds it (``global_rank``/``world_size``, the config's
strategy), through a DataLoader of ``workers`` workers and batches of ``batch``; what each rank got is
written as JSON to ``out``.

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


def main(config_path: str, world: int, workers: int, batch: int, out: str) -> None:
    import torch
    import yaml
    from nemo.collections.asr.data.audio_to_text import TarredAudioToCharDataset

    with open(config_path, encoding="utf-8") as f:
        train_ds = yaml.safe_load(f)["train_ds"]
    with open(train_ds["manifest_filepath"], encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    labels = sorted({c for line in lines for c in line["text"]})  # every character its own label: text back whole
    ranks = []
    for rank in range(world):
        dataset = TarredAudioToCharDataset(train_ds["tarred_audio_filepaths"], train_ds["manifest_filepath"], labels,
                                           16000, shuffle_n=0, normalize=False, parser="base",
                                           shard_strategy=train_ds["tarred_shard_strategy"], global_rank=rank,
                                           world_size=world, return_sample_id=True)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers,
                                             collate_fn=dataset.collate_fn)
        batches = []
        for audio, audio_len, tokens, tokens_len, sample_ids in loader:
            batches.append([{"line": lines[sid], "frames": int(audio_len[i]),
                             "digest": hashlib.sha256(audio[i, :audio_len[i]].numpy().astype("float32").tobytes()).hexdigest(),
                             "text": "".join(labels[t] for t in tokens[i, :tokens_len[i]].tolist())}
                            for i, sid in enumerate(sample_ids.tolist())])
        ranks.append({"length": len(dataset), "batches": batches})
    with open(out, "w", encoding="utf-8") as f:
        json.dump(ranks, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
