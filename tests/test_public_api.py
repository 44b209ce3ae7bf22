"""The public Python API (``shardkit.__all__``): every name importable, defined where ``_PUBLIC`` says,
documented with its arguments, result, errors and an example; ``import shardkit`` light; the old
module paths kept working; inside the package every name imported from the module that defines it;
docstrings on at least 90% of the package's public definitions."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import pickle
import re
import subprocess
import sys

import pytest
from support import REPO

import shardkit
from shardkit._aliases import ALIASES

sys.path.insert(0, os.path.join(REPO, "scripts"))
import check_docstrings  # noqa: E402

PACKAGE = os.path.join(REPO, "shardkit")
NOTHING_TO_RAISE = {"warn_and_skip"}  # an on_error policy: it only logs
SECTION = re.compile(r"^(Args|Arguments|Returns|Yields|Raises|Example|Examples):\s*$", re.MULTILINE)


def test_the_api_has_what_a_trainer_needs():
    for name in ("iter_samples", "ShardDataset", "collate_padded", "equal_steps", "ShardkitError",
                 "gather_loader_state", "restore_loader_state"):
        assert name in shardkit.__all__
    assert len(set(shardkit.__all__)) == len(shardkit.__all__)
    assert set(dir(shardkit)) >= set(shardkit.__all__)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = shardkit.no_such_name


@pytest.mark.parametrize("name", shardkit.__all__)
def test_every_public_name_is_defined_in_its_listed_module(name):
    """The object itself lives there (not a wrapper, not an alias of another name)."""
    module = importlib.import_module(shardkit._PUBLIC[name])
    value = getattr(shardkit, name)
    assert getattr(module, name) is value
    assert (value.__module__, value.__qualname__) == (module.__name__, name)


def _sections(doc: str) -> dict[str, str]:
    """Section title -> its text, for a Google-style docstring."""
    doc = inspect.cleandoc(doc)
    found = list(SECTION.finditer(doc))
    return {m.group(1): doc[m.end():(found[i + 1].start() if i + 1 < len(found) else len(doc))]
            for i, m in enumerate(found)}


def _parameters(callable_) -> list[str]:
    return [p.name for p in inspect.signature(callable_).parameters.values() if p.name != "self"]


@pytest.mark.parametrize("name", shardkit.__all__)
def test_every_public_name_is_documented_with_its_sections(name):
    value = getattr(shardkit, name)
    doc = inspect.getdoc(value)
    assert doc and len(doc.splitlines()) >= 5, f"{name}: a real docstring, not a line"
    sections = _sections(value.__doc__)
    assert "Example" in sections or "Examples" in sections, f"{name}: no Example section"
    if inspect.isclass(value):
        own_init = "__init__" in vars(value)
        parameters = _parameters(value.__init__) if own_init else []
        if own_init and not issubclass(value, Exception):
            assert "Raises" in sections, f"{name}: no Raises section"
    else:
        parameters = _parameters(value)
        assert "Returns" in sections or "Yields" in sections, f"{name}: no Returns or Yields section"
        assert "Raises" in sections or name in NOTHING_TO_RAISE, f"{name}: no Raises section"
    if parameters:
        args = sections.get("Args", "")
        missing = [p for p in parameters if not re.search(rf"^\s*\**{p}\b.*:", args, re.MULTILINE)]
        assert not missing, f"{name}: Args does not describe {missing}"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO})


def test_import_shardkit_stays_light():
    done = _python("import sys, shardkit; names = shardkit.__all__; heavy = sorted(m for m in sys.modules "
                   "if m.split('.')[0] in ('numpy', 'torch', 'soundfile', 'zstandard', 'click')); print(heavy)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_public_name_imports_its_module_on_first_use():
    done = _python("import sys, shardkit; before = 'shardkit.training.reader' in sys.modules;"
                   "f = shardkit.iter_samples; print(before, f.__module__ in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


# The one test of the old module paths (shardkit.dataset, .reader, .wds, .tario, .advice,
# .training.wenet): users' code and pickles still name them; nothing else in the tests does.
@pytest.mark.parametrize("old, new", sorted(ALIASES.items()))
def test_an_old_module_path_is_the_module_itself(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)
    done = _python(f"import {old}, {new}, sys; assert {old} is {new}, 'two modules';"
                   f"assert sys.modules[{old!r}] is {new}; print({old}.__spec__.name)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == new  # one module under two names, its real spec kept


def test_the_old_names_inside_old_paths_still_work():
    from shardkit.dataset import ShardDataset, equal_steps
    from shardkit.reader import iter_samples
    from shardkit.training.state import gather, restore

    assert (ShardDataset, equal_steps, iter_samples) == (shardkit.ShardDataset, shardkit.equal_steps,
                                                         shardkit.iter_samples)
    assert (gather, restore) == (shardkit.gather_loader_state, shardkit.restore_loader_state)
    assert pickle.loads(pickle.dumps(ShardDataset)) is shardkit.ShardDataset


def test_a_shard_dataset_pickles_and_reads_the_same(make_shards):
    pytest.importorskip("torch")
    shards = make_shards("gz")
    dataset = shardkit.ShardDataset(shards, rank=0, world_size=1, seed=4, dtype="int16")
    dataset.set_epoch(2)
    copy = pickle.loads(pickle.dumps(dataset))
    assert type(copy) is shardkit.ShardDataset
    assert (copy.shards, copy.seed, copy.epoch, copy.dtype) == (dataset.shards, 4, 2, "int16")
    read = [(s["key"], s["audio"].numpy().tobytes()) for s in dataset]
    assert len(read) == sum(1 for _ in shardkit.iter_samples(shards, decode=False)) > 5
    assert [(s["key"], s["audio"].numpy().tobytes()) for s in copy] == read


def test_docstrings_cover_ninety_percent_of_public_definitions(capsys):
    """Counted over the whole package, training/wds.py included (scripts/check_docstrings.py)."""
    assert check_docstrings.main([PACKAGE, "--min", "0.90"]) == 0, capsys.readouterr().out


def test_the_docstring_count_sees_missing_ones(tmp_path):
    package = tmp_path / "pkg"
    (package / "_private").mkdir(parents=True)
    (package / "__init__.py").write_text('"""A package."""\n')
    (package / "mod.py").write_text('def documented():\n    """Yes."""\n\n\ndef bare():\n    pass\n\n\n'
                                    'class Thing:\n    """A thing."""\n\n    def method(self):\n        pass\n\n'
                                    '    def _hidden(self):\n        pass\n')
    (package / "_private" / "inner.py").write_text("def skipped():\n    pass\n")
    covered, missing = check_docstrings.measure(str(package))
    assert covered == 2
    assert [m.split(" ")[1] for m in missing] == ["bare", "Thing.method"]
    assert check_docstrings.main([str(package), "--min", "0.5", "--quiet"]) == 0
    assert check_docstrings.main([str(package), "--min", "0.6", "--quiet"]) == 1


# --- inside the package, each name is imported from the module that defines it

# (importing module, source module, name) of an import that deliberately goes through a re-export
ALLOWED_THROUGH_REEXPORTS: set[tuple[str, str, str]] = set()


def _module_file(name: str) -> str | None:
    """The source file of module ``name`` (found by importlib), or None when it is not a module."""
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # a parent that is a module, not a package
        return None
    return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a module defines itself (def, class, assignment; also under if/try/with at top level):
    not the ones it only imports."""
    names: set[str] = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            else:
                names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))

    visit(tree.body)
    return names


def _imports_through_reexports(root: str) -> list[str]:
    defined: dict[str, set[str] | None] = {}
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, file)
            parts = os.path.relpath(path, os.path.dirname(root))[:-3].split(os.sep)
            package = ".".join(parts[:-1])
            importer = package if parts[-1] == "__init__" else ".".join(parts)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = node.module or ""
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                if source.split(".")[0] != "shardkit":
                    continue
                if source not in defined:
                    origin = _module_file(source)
                    defined[source] = _bound_names(ast.parse(open(origin, encoding="utf-8").read())) if origin else None
                for alias in node.names:
                    if _module_file(f"{source}.{alias.name}") or alias.name in (defined[source] or ()):
                        continue  # a submodule, or a name the module defines
                    if (importer, source, alias.name) not in ALLOWED_THROUGH_REEXPORTS:
                        found.append(f"{os.path.relpath(path, REPO)}:{node.lineno}: from {source} import {alias.name}")
    return found


def test_no_import_inside_the_package_goes_through_a_reexport():
    assert _imports_through_reexports(PACKAGE) == []


def test_the_reexport_finder_finds_one(tmp_path):
    package = tmp_path / "shardkit_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "home.py").write_text("VALUE = 1\n")
    (package / "facade.py").write_text("from shardkit.errors import ShardkitError  # noqa: F401\n")
    (package / "user.py").write_text("from shardkit.io.files import AtomicFile\nfrom shardkit.errors import UsageError\n"
                                     "from shardkit.commands.index import iter_index\n")
    found = _imports_through_reexports(str(package))
    assert found == [f"{os.path.relpath(str(package / 'user.py'), REPO)}:3: from shardkit.commands.index import "
                     "iter_index"]


def test_the_api_reference_parses_every_public_docstring_cleanly():
    """What mkdocstrings renders (griffe, Google style): no warning (a strict docs build fails on one),
    one Returns or Yields item each (a continuation line not indented would make a second)."""
    griffe = pytest.importorskip("griffe")
    import logging

    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    logger = logging.getLogger("griffe")
    handler = Collect(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        package = griffe.GriffeLoader(docstring_parser=griffe.Parser.google, search_paths=[REPO]).load("shardkit")
        for name, module in shardkit._PUBLIC.items():
            documented = package[f"{module.removeprefix('shardkit.')}.{name}"]
            sections = documented.docstring.parse(griffe.Parser.google)
            for section in sections:
                if section.kind.value in ("returns", "yields"):
                    assert len(section.value) == 1, f"{name}: {len(section.value)} {section.kind.value} items"
    finally:
        logger.removeHandler(handler)
    assert warnings == []
