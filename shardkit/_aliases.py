"""Old import paths kept working without a module file each: ``import shardkit.dataset`` gives the
module object of ``shardkit.training.dataset`` itself (so attributes, monkeypatches and pickles agree).
They are not part of the documented API; new code imports from ``shardkit`` or the defining module."""

import importlib
import importlib.util
import sys

# old path -> where the module lives now
ALIASES = {
    "shardkit.dataset": "shardkit.training.dataset",
    "shardkit.reader": "shardkit.training.reader",
    "shardkit.wds": "shardkit.training.wds",
    "shardkit.tario": "shardkit.io.tar",
    "shardkit.advice": "shardkit.planning.advice",
    "shardkit.training.wenet": "shardkit.training.zstd_hook",
}


# plain classes: the import system calls these methods by name, and importlib.abc would import
# importlib.resources (tempfile, shutil, random: 0.02 CPU-s, benchmarks/results/2026-11-28-flac.md) into every
# process that imports shardkit
class _AliasLoader:
    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self.real_spec = module.__spec__
        return module

    def exec_module(self, module):
        # already executed under its real name; the import system has just set __spec__ to the
        # alias's spec: give the real one back, so reload() and tools see one module, not two
        module.__spec__ = self.real_spec


class _AliasFinder:
    def find_spec(self, fullname, path=None, target=None):
        real = ALIASES.get(fullname)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


def install() -> None:
    """Put the alias finder on ``sys.meta_path`` once (idempotent across reloads)."""
    if not any(type(finder).__name__ == "_AliasFinder" and type(finder).__module__ == __name__
               for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
