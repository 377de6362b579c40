"""The one rule for matching GPU names: the store's key, the service's lookups, the header's C++.

A GPU is stored under the name its driver reports (``"NVIDIA H200"``, ``"NVIDIA
A100-SXM4-80GB"``); users write it shorter or differently (``"H200"``, ``"h200"``,
``"nvidia-h200"``). All of them are compared by :func:`normalize_gpu_name`:

- only ASCII letters and digits count; every run of anything else (spaces, ``-``, ``_``,
  parentheses, non-ASCII) is one separator, and separators at either end are dropped;
- ASCII letters are lower-cased;
- a leading word ``nvidia`` is dropped (only the first word: ``"Tesla NVIDIA X"`` keeps it).

So ``"NVIDIA H200"``, ``"nvidia-h200"``, ``"H200"`` all give ``"h200"`` and ``"NVIDIA
A100-SXM4-80GB"`` gives ``"a100 sxm4 80gb"``. The rule is defined on ASCII alone so that the
exported header's C++ (``fa2tune_detail::normalise_name`` in
codegen/templates/gpu_name.cuh, which works on bytes) computes exactly the same key;
tests/core/test_gpu_name.py compiles it and compares the two on a list of names.

The store keeps this key in ``gpus.name_key``: changing the rule changes which rows a lookup
finds, so it changes together with the C++ and with a data migration of that column.
"""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[^0-9A-Za-z]+")


def normalize_gpu_name(name: str) -> str:
    """The matching key of a GPU name (see the module docstring for the rule).

    Args:
        name: a GPU name as reported by the driver or written by a user.

    Returns:
        Lower-case ASCII words separated by single spaces, without a leading ``nvidia``;
        ``""`` for a name with no letters or digits (or just ``"NVIDIA"``).
    """
    words = _SEPARATORS.sub(" ", name).lower().split()
    if words and words[0] == "nvidia":
        words = words[1:]
    return " ".join(words)
