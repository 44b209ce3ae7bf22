"""Make WeNet read ``.tar.zst`` shards on Python 3.10-3.13 without editing WeNet.

``enable_zstd`` writes a ``.pth`` file into the environment's site-packages (or ``target``); at
every interpreter start, ``site`` runs its one import line, which activates
:mod:`shardkit.io.zstd_tarfile` (a lazy hook: tarfile gains zstd when it is imported). The line is
guarded: if shardkit is uninstalled later, the leftover file does nothing instead of printing a
traceback at every start (``status`` then reports that tarfile cannot read zstd).
``disable_zstd`` removes the file; ``zstd_status`` asks a fresh interpreter whether
``tarfile.open(fileobj=..., mode="r:*")`` opens a ``.tar.zst``, which is what WeNet calls.
On Python 3.14+ tarfile reads zstd natively and nothing is written.
"""

from __future__ import annotations

import io
import json
import os
import platform
import subprocess
import sys
import sysconfig

from shardkit.errors import ShardkitError, UsageError

PTH_NAME = "shardkit_zstd_tarfile.pth"
HOOK_MODULE = "shardkit.io.zstd_tarfile"
# site.addpackage exec()s a line that starts with "import" and skips lines that start with "#".
# The try/except keeps a file left behind by an uninstalled shardkit silent at startup; it is
# spelled through exec because a .pth line is one statement list. (importlib.util.find_spec
# would read better but costs ~3.6 ms of imports at every start in a bare venv; this ~0.7 ms.)
PTH_TEXT = (
    "# Written by `shardkit wenet enable-zstd`: Python's tarfile reads .tar.zst (as on 3.14).\n"
    "# Remove with `shardkit wenet disable-zstd`, or switch off per process with SHARDKIT_ZSTD_TARFILE=0.\n"
    'import sys; exec("try:\\n import ' + HOOK_MODULE + ' as hook\\nexcept ImportError:\\n pass\\n'
    'else:\\n hook.activate()")\n'
)
PROBE_TIMEOUT_S = 60

# Runs in a fresh interpreter: does WeNet's call open a zstd tar there?
_PROBE = r"""
import io, json, os, site, sys
target = os.path.realpath(sys.argv[1])
startup_dirs = {os.path.realpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]}
site_dir = target in startup_dirs
if not site_dir:
    site.addsitedir(target)  # processes its .pth files exactly as interpreter startup would
import tarfile
blob = sys.stdin.buffer.read()
try:
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as archive:
        names = archive.getnames()
    error = None if names == ["probe.txt"] else f"read members {names!r}"
except Exception as err:
    if "zst" not in tarfile.TarFile.OPEN_METH:
        error = "this tarfile has no zstd support (hook not active)"
    else:
        error = f"{type(err).__name__}: " + " ".join(line.strip() for line in str(err).splitlines())
print(json.dumps({"reads_zstd": error is None, "error": error, "target_is_site_dir": site_dir}))
"""


def python_version() -> str:
    """The running interpreter's version (``3.11.9``), as reports show it."""
    return platform.python_version()


def native_zstd() -> bool:
    """Python 3.14+ tarfile reads zstd itself."""
    return sys.version_info >= (3, 14)


def default_target() -> str:
    """site-packages (purelib) of the running interpreter: the active environment."""
    return sysconfig.get_paths()["purelib"]


def pth_path(target: str | None = None) -> str:
    """Where the hook file lives in ``target`` (default: this environment's site-packages)."""
    return os.path.join(os.path.abspath(target or default_target()), PTH_NAME)


def backports_zstd_version() -> str | None:
    """The installed backports.zstd version, "unknown version" when it has no metadata, None when absent."""
    from importlib import metadata
    from importlib.util import find_spec

    try:
        if find_spec("backports.zstd") is None:
            return None
    except ModuleNotFoundError:  # no "backports" namespace at all
        return None
    try:
        return metadata.version("backports.zstd")
    except metadata.PackageNotFoundError:
        return "unknown version"


def _probe_blob() -> bytes:
    import tarfile

    from shardkit.io.codecs import open_writer

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as archive:
        info = tarfile.TarInfo("probe.txt")
        info.size = 5
        archive.addfile(info, io.BytesIO(b"probe"))
    out = io.BytesIO()
    with open_writer(out, "zst") as compressed:  # as shardkit writes shards: a frame, then the seek table
        compressed.write(buf.getvalue())
    return out.getvalue()


def probe(target: str | None = None) -> dict:
    """Ask a fresh interpreter (with ``target``'s .pth files processed) whether tarfile reads zstd."""
    target = os.path.abspath(target or default_target())
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, target], input=_probe_blob(),
                              capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"reads_zstd": False, "error": f"probe interpreter failed: {err}", "target_is_site_dir": False}
    try:
        return json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"reads_zstd": False, "error": f"probe interpreter failed: {tail[0]}", "target_is_site_dir": False}


def _check_target(target: str | None) -> str:
    folder = os.path.abspath(target or default_target())
    if not os.path.isdir(folder):
        raise UsageError("target folder does not exist (give a site-packages folder)", shard=folder)
    return folder


def enable_zstd(target: str | None = None, *, verify: bool = True) -> dict:
    """Make Python's tarfile (and so WeNet's reader) open ``.tar.zst`` in an environment; idempotent.

    Writes a ``.pth`` file into ``target``: at every interpreter start, ``site`` runs its one
    guarded import line, which gives tarfile zstd through backports.zstd. On Python 3.14+ tarfile
    reads zstd natively and nothing is written. The same as ``shardkit wenet enable-zstd``.

    Args:
        target: a site-packages folder (default: the running interpreter's, i.e. the active environment).
        verify: ask a fresh interpreter afterwards whether ``tarfile.open(fileobj=..., mode="r:*")``
            reads a shardkit ``.tar.zst`` (the result is under ``"probe"``).

    Returns:
        ``{"action": "native" | "written" | "unchanged", "pth": path or None, "python",
            "executable", "backports_zstd": version, "probe": {"reads_zstd", "error",
            "target_is_site_dir"} or None}``.

    Raises:
        UsageError: ``target`` is not a folder.
        ShardkitError: backports.zstd is not installed, or the file cannot be written (naming it).

    Example:
        ```python
        result = shardkit.enable_zstd()  # into the environment WeNet trains in
        assert result["action"] == "native" or result["probe"]["reads_zstd"]
        ```
    """
    from shardkit.io.files import atomic_write_bytes

    result = {"python": python_version(), "executable": sys.executable, "pth": pth_path(target),
              "backports_zstd": None, "probe": None}
    if native_zstd():
        return {**result, "action": "native", "pth": None}
    folder = _check_target(target)
    result["backports_zstd"] = backports_zstd_version()
    if result["backports_zstd"] is None:
        raise ShardkitError(f"backports.zstd is not installed for {sys.executable}; the hook reads zstd "
                            "through it. Run: pip install backports.zstd")
    path = os.path.join(folder, PTH_NAME)
    if _read_text(path) == PTH_TEXT:
        result["action"] = "unchanged"
    else:
        try:
            atomic_write_bytes(path, PTH_TEXT.encode("utf-8"))
        except OSError as err:
            raise ShardkitError(f"cannot write the hook ({err.strerror or err}); give a writable "
                                "site-packages folder with --target", shard=path) from err
        result["action"] = "written"
    if verify:
        result["probe"] = probe(folder)
    return result


def disable_zstd(target: str | None = None) -> dict:
    """Remove the ``.pth`` file :func:`enable_zstd` wrote; the next interpreter's tarfile reads no zstd.

    Args:
        target: the site-packages folder it was written to (default: the running interpreter's).

    Returns:
        ``{"action": "removed" | "absent", "pth": path}``.

    Raises:
        UsageError: the file there was not written by shardkit (it is left in place).
        ShardkitError: the file cannot be read or removed (naming it).

    Example:
        ```python
        shardkit.disable_zstd()["action"]  # "removed", or "absent" when there was none
        ```
    """
    path = pth_path(target)
    text = _read_text(path)
    if text is None:
        return {"action": "absent", "pth": path}
    if HOOK_MODULE not in text:
        raise UsageError(f"{PTH_NAME} was not written by shardkit (it does not import {HOOK_MODULE}); "
                         "left in place", shard=path)
    try:
        os.unlink(path)
    except OSError as err:
        raise ShardkitError(f"cannot remove the hook ({err.strerror or err})", shard=path) from err
    return {"action": "removed", "pth": path}


def zstd_status(target: str | None = None) -> dict:
    """Whether WeNet's ``tarfile.open(fileobj=..., mode="r:*")`` reads zstd in an environment.

    Asks a fresh interpreter (with ``target``'s ``.pth`` files processed) to open a small
    ``.tar.zst`` written as shardkit writes shards: the answer is what the trainer will see.

    Args:
        target: a site-packages folder (default: the running interpreter's).

    Returns:
        ``{"reads_zstd": bool, "native": bool, "installed": bool, "current": bool, "pth",
            "python", "executable", "backports_zstd", "probe"}``; ``current`` is False for a hook file
            of another shardkit version, ``probe["error"]`` says why zstd is not read.

    Raises:
        ShardkitError: the hook file exists but cannot be read (naming it).

    Example:
        ```python
        if not shardkit.zstd_status()["reads_zstd"]:
            shardkit.enable_zstd()
        ```
    """
    path = pth_path(target)
    text = _read_text(path)
    status = {"python": python_version(), "executable": sys.executable, "native": native_zstd(),
              "pth": path, "installed": text is not None, "current": text == PTH_TEXT,
              "backports_zstd": backports_zstd_version()}
    status["probe"] = probe(target)
    status["reads_zstd"] = status["probe"]["reads_zstd"]
    return status


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise ShardkitError(f"cannot read ({err})", shard=path) from err
