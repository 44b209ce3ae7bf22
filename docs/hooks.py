"""mkdocs hook: the API reference page, generated from ``shardkit._PUBLIC``.

The page lists exactly the public API (``shardkit.__all__``) plus the WebDataset stages, which users
import from ``shardkit.training.wds``; each entry is rendered by mkdocstrings from the docstring of the
module that defines it, so a name added to ``_PUBLIC`` appears here with no edit to the docs.
"""

from __future__ import annotations

import re

from markdown import Extension
from markdown.preprocessors import Preprocessor
from mkdocs.structure.files import File

API_PAGE = "reference/api.md"
CLI_PAGE = "reference/cli.md"
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


# Docstrings written for Sphinx say :func:`name`; mkdocstrings renders the role's text before the code.
SPHINX_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(?=<code>)")


def on_files(files, config):
    files.append(File.generated(config, API_PAGE, content=api_page_markdown()))
    return files


def on_page_content(html, page, config, files):
    if page.file.src_uri == API_PAGE:
        return SPHINX_ROLE.sub("", html)
    return html


# mkdocs-click hands the commands' help text to Markdown, which takes `OUT_DIR/<stem>.tar` for an HTML tag
# and `modes r:*, r|*` for emphasis; on the CLI page, outside code (the fenced usage and options, and
# code spans), placeholders and asterisks are escaped so the page says what --help says.
PLACEHOLDER = re.compile(r"<([^<>\s:]+)>")
_page_being_rendered = None


def _literal_help_text(line: str) -> str:
    parts = line.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = PLACEHOLDER.sub(r"&lt;\1&gt;", parts[i]).replace("*", "\\*")
    return "`".join(parts)


class _HelpPlaceholders(Preprocessor):
    def run(self, lines):
        if _page_being_rendered != CLI_PAGE:
            return lines
        out, fenced = [], False
        for line in lines:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                line = _literal_help_text(line)
            out.append(line)
        return out


class _HelpPlaceholdersExtension(Extension):
    def extendMarkdown(self, md):  # noqa: N802  (Markdown's name)
        md.preprocessors.register(_HelpPlaceholders(md), "shardkit_help_placeholders", 140)  # after mkdocs-click (141)


def on_config(config):
    config.markdown_extensions.append(_HelpPlaceholdersExtension())
    return config


def on_page_markdown(markdown, page, config, files):
    global _page_being_rendered
    _page_being_rendered = page.file.src_uri
    return markdown
