"""What rendering shares across families: writing files, the template directory and hash.

Each family renders its own instantiation files (its registry entry's ``render``, derived
from its config's declarations by :mod:`codegen.families.declared`): two lines, the template
include and one ``<FAMILY>_DEFINE_KERNEL(...)`` (see docs/architecture.md). Files are only
rewritten when their text changes, so ninja's timestamps stay meaningful across runs.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from importlib import resources
from pathlib import Path

from core.elements import cuda_type

TEMPLATE_HEADER = "fa2_fwd.cuh"


class TemplateMissingError(FileNotFoundError):
    """A kernel template (or a header it includes) is not in the template directory."""


def cuda_elem_type(dtype: str) -> str:
    """The CUDA element type of a config dtype (``"fp16"`` -> ``"__half"``).

    Raises:
        ValueError: for an unknown dtype.
    """
    return cuda_type(dtype)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless the file already holds exactly that text.

    The write goes through a temporary file and an atomic rename, so a concurrent reader
    (another build of the same config) never sees a half-written file.

    Args:
        path: destination; parent directories are created.
        text: file content.

    Returns:
        True when the file was (re)written, False when it was already up to date.
    """
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def template_dir() -> Path:
    """The directory holding ``fa2_fwd.cuh`` (the package's ``codegen/templates``).

    Raises:
        RuntimeError: when the package is not installed as plain files (e.g. from a zip),
            because nvcc needs a real include directory.
    """
    traversable = resources.files("codegen").joinpath("templates")
    path = Path(str(traversable))
    if not isinstance(traversable, Path) and not path.is_dir():
        raise RuntimeError(f"codegen templates are not on the file system: {traversable}")
    return path


_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def template_files(main: str = TEMPLATE_HEADER, directory: Path | None = None) -> list[str]:
    """``main`` and every template it includes with ``#include "..."``, transitively.

    These are the files a kernel build of ``main``'s family reads from the template
    directory (system includes in angle brackets are the toolkit's, versioned by nvcc's
    release line instead). Sorted relative names.

    Raises:
        TemplateMissingError: ``main`` or an included file is not in the directory.
    """
    root = directory if directory is not None else template_dir()
    found: set[str] = set()
    todo = [main]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        path = root / name
        if not path.is_file():
            raise TemplateMissingError(f"kernel template {name} not found in {root}")
        found.add(name)
        todo += _INCLUDE_RE.findall(path.read_text(encoding="utf-8", errors="replace"))
    return sorted(found)


def template_hash(directory: Path | None = None, main: str = TEMPLATE_HEADER) -> str:
    """SHA-256 over the template files one family's kernels read (relative names, contents).

    The files are :func:`template_files` of the family's main template, so an edit to it or
    to any header it includes changes the hash and thus every build directory derived from
    it (:func:`codegen.build.source_hash`), while templates of other families and the
    exported header's dispatch code (``dispatch.cuh``, which includes the kernel) do
    not. The exported header names the kernel source by this same digest.

    Args:
        directory: the template directory; defaults to :func:`template_dir`.
        main: the family's main template (``fa2_fwd.cuh`` for the mma.sync family).

    Returns:
        The hex digest (64 characters).
    """
    root = directory if directory is not None else template_dir()
    h = hashlib.sha256()
    for rel_name in template_files(main, root):
        rel = rel_name.encode()
        data = (root / rel_name).read_bytes()
        # Length-prefixed fields, so that no two different trees hash alike.
        h.update(len(rel).to_bytes(8, "little") + rel)
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()
