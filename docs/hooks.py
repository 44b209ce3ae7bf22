"""mkdocs hook: the API reference page, generated from ``shardkit._PUBLIC``.

The page lists exactly the public API (``shardkit.__all__``) plus the WebDataset stages, which users
import from ``shardkit.training.wds``; each entry is rendered by mkdocstrings from the docstring of the
module that defines it, so a name added to ``_PUBLIC`` appears here with no edit to the docs.
"""

from __future__ import annotations

from mkdocs.structure.files import File

API_PAGE = "reference/api.md"
# Imported by users as a module (the WebDataset stages), so documented as one.
EXTRA_MODULES = ("shardkit.training.wds",)

INTRO = """# Python API

The public API is `shardkit.__all__`: import every name from `shardkit` itself
(`import shardkit; shardkit.ShardDataset(...)`). The names are imported on first use, so
`import shardkit` stays light. The WebDataset stages are the one exception: they live in
`shardkit.training.wds` (see [Training with WebDataset](../guides/webdataset.md)).

This page is generated from `shardkit._PUBLIC` (name -> defining module) by `docs/hooks.py`.
"""


def api_page_markdown() -> str:
    from shardkit import _PUBLIC

    blocks = [INTRO]
    for name, module in _PUBLIC.items():
        blocks.append(f"::: {module}.{name}\n")
    blocks.append("## WebDataset stages\n")
    for module in EXTRA_MODULES:
        blocks.append(f"::: {module}\n    options:\n      show_root_heading: false\n      heading_level: 3\n")
    return "\n".join(blocks)


def on_files(files, config):
    files.append(File.generated(config, API_PAGE, content=api_page_markdown()))
    return files
