"""Teach the standard library's ``tarfile`` zstd on Python 3.10-3.13, the way 3.14's does it.

WeNet opens every shard with ``tarfile.open(fileobj=f, mode="r:*")``; before 3.14 that cannot read
``.tar.zst``. ``shardkit wenet enable-zstd`` writes a one-line ``.pth`` file into site-packages that
calls :func:`activate` at interpreter start. Activation is lazy: it only registers an import hook,
so a process that never imports ``tarfile`` pays nothing (no ``tarfile``, no ``backports.zstd``
import at startup). When ``tarfile`` is imported, :func:`patch` adds exactly what 3.14 has:

- ``TarFile.zstopen`` and ``OPEN_METH["zst"]``: modes ``r:zst``, ``w:zst``, ``x:zst``, and ``r:*``
  detection. The file object is ``backports.zstd.ZstdFile`` (3.14's ``compression.zstd.ZstdFile``
  backported by its author), so random access works as over bz2: forward seeks decompress ahead,
  a backward seek restarts from the beginning (slow, correct).
- stream modes ``r|zst``, ``w|zst``, and zstd detection in ``r|*`` (magic ``28 b5 2f fd``).

Nothing else about ``tarfile`` changes: other compressions go through the original code paths.
Everything here is idempotent (activating or patching twice changes nothing) and reversible
(:func:`unpatch`). On 3.14+ tarfile already has all of this, and nothing is done.

This module imports only ``os`` and ``sys``, both loaded before any ``.pth`` file runs.
"""

from __future__ import annotations

import os
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Set to 0 to switch the hook off for one process without uninstalling it.
DISABLE_ENV = "SHARDKIT_ZSTD_TARFILE"
# Marks the finder and the patched functions, so repeated activation can recognise its own work
# even across a reload of this module (class identity would not survive that).
_MARK = "_shardkit_zstd"
_MISSING = "backports.zstd is not installed (pip install backports.zstd)"


def needed() -> bool:
    """True where the standard library's tarfile cannot read zstd (Python < 3.14)."""
    return sys.version_info < (3, 14)


def activate() -> None:
    """Called by the ``.pth`` line: patch tarfile now if loaded, and on every (re)import."""
    if not needed() or os.environ.get(DISABLE_ENV, "1") == "0":
        return
    if not any(getattr(finder, _MARK, False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TarfileFinder())
    tarfile = sys.modules.get("tarfile")
    if tarfile is not None:
        patch(tarfile)


def deactivate() -> None:
    """Remove the import hook and restore tarfile in this process (tests; the .pth file stays)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, _MARK, False)]
    tarfile = sys.modules.get("tarfile")
    if tarfile is not None:
        unpatch(tarfile)


def is_patched(tarfile) -> bool:
    """Whether this ``tarfile`` module already reads zstd through the hook (so it is not patched twice)."""
    return getattr(tarfile.TarFile, _MARK, False)


def patch(tarfile) -> bool:
    """Add zstd to a loaded ``tarfile`` module; False if it already reads zstd (native or patched)."""
    if "zst" in tarfile.TarFile.OPEN_METH:
        return False
    original_init = tarfile._Stream.__init__

    def __init__(self, name, mode, comptype, fileobj, bufsize, *args, **kwargs):
        # '*' in write mode and every other type take the original path untouched.
        if comptype not in ("*", "zst") or (comptype == "*" and mode != "r"):
            return original_init(self, name, mode, comptype, fileobj, bufsize, *args, **kwargs)
        own_file = fileobj is None
        if own_file:
            fileobj = tarfile._LowLevelFile(name, mode)
        try:
            if comptype == "*":
                fileobj = tarfile._StreamProxy(fileobj)
                if not fileobj.buf.startswith(ZSTD_MAGIC):
                    original_init(self, name, mode, fileobj.getcomptype(), fileobj, bufsize, *args, **kwargs)
                    self._extfileobj = not own_file
                    return
            # Let the original set up an uncompressed stream, then put the zstd codec in front, in
            # the same attributes its bz2/xz branches use (cmp, dbuf, exception).
            original_init(self, name, mode, "tar", fileobj, bufsize, *args, **kwargs)
            self._extfileobj = not own_file
            self.comptype = "zst"
            try:
                from backports import zstd
            except ImportError:
                raise tarfile.CompressionError(_MISSING) from None
            if mode == "r":
                self.dbuf = b""
                self.cmp = _FrameChainDecompressor(zstd)
                self.exception = zstd.ZstdError
            else:
                self.cmp = zstd.ZstdCompressor()
        except BaseException:
            if own_file:
                fileobj.close()
            self.closed = True
            raise

    def zstopen(cls, name, mode="r", fileobj=None, level=None, options=None, zstd_dict=None, **kwargs):
        """Open zstd compressed tar archive name for reading or writing (as Python 3.14's)."""
        if mode not in ("r", "w", "x"):
            raise ValueError("mode must be 'r', 'w' or 'x'")
        try:
            from backports.zstd import ZstdError, ZstdFile
        except ImportError:
            raise tarfile.CompressionError(_MISSING) from None
        fileobj = ZstdFile(fileobj or name, mode, level=level, options=options, zstd_dict=zstd_dict)
        try:
            archive = cls.taropen(name, mode, fileobj, **kwargs)
        except (ZstdError, EOFError) as err:
            fileobj.close()
            if mode == "r":
                raise tarfile.ReadError("not a zstd file") from err
            raise
        except Exception:
            fileobj.close()
            raise
        archive._extfileobj = False
        return archive

    __init__.__wrapped__ = original_init
    setattr(__init__, _MARK, True)
    tarfile._Stream.__init__ = __init__
    tarfile.TarFile.zstopen = classmethod(zstopen)
    tarfile.TarFile.OPEN_METH["zst"] = "zstopen"
    setattr(tarfile.TarFile, _MARK, True)
    return True


def unpatch(tarfile) -> bool:
    """Undo :func:`patch`; False if this module had not patched it."""
    if not is_patched(tarfile):
        return False
    del tarfile.TarFile.OPEN_METH["zst"]
    del tarfile.TarFile.zstopen
    delattr(tarfile.TarFile, _MARK)
    tarfile._Stream.__init__ = tarfile._Stream.__init__.__wrapped__
    return True


class _FrameChainDecompressor:
    """zstd frames back to back (pzstd output, concatenated files) read as one stream, as ZstdFile does."""

    def __init__(self, zstd):
        self._zstd = zstd
        self._frame = zstd.ZstdDecompressor()

    def decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame.eof:
                self._frame = self._zstd.ZstdDecompressor()
            out.append(self._frame.decompress(data))
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)


class _PatchingLoader:
    """Runs the real loader of ``tarfile``, then patches the fresh module; delegates everything else."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name):  # get_source, get_filename, get_resource_reader, ...
        return getattr(self._loader, name)


class _TarfileFinder:
    """A meta-path finder that answers only for ``tarfile``, with the spec the others find."""

    _shardkit_zstd = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tarfile":
            return None
        for finder in sys.meta_path:
            if getattr(finder, _MARK, False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec
