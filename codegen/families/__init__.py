"""The kernel families: the registry (:mod:`codegen.families.registry`) and the built-in ones.

Each family is a folder here (its space, host preparation and registry entry); this module
registers the built-in ones, one line, in the order a campaign searches them. Stages use the
names re-exported here (:class:`Family`, :class:`HeaderPart`, :func:`family`,
:func:`family_of`, :func:`families_for`, :data:`FAMILIES`, :func:`register`) and never a
family's own modules.

Adding a family, in this order:

1. The template under ``codegen/templates`` (``<name>_fwd.cuh`` with its
   ``<NAME>_DEFINE_KERNEL`` macro and ``<name>::Traits``; a launcher header for the
   exported header).
2. Its config: ``core/<name>_config.py``, a ``@family_config("<name>", example=...)`` frozen,
   ordered dataclass over :class:`core.config_common.FamilyConfigBase` whose parameters are
   each one :func:`core.config_common.param` (name token, Traits place, search name); add
   ``threads``, ``smem_bytes`` and ``describe``. Name, parsing, dict form, stored and search
   parameters, instantiation and Traits arguments follow from the declarations.
3. ``codegen/families/<name>/``: ``space.py`` (valid configs, seeds, default),
   ``host.py`` when the kernel takes more than ``FaParams`` (torch / cuda-bindings imported
   only when called), and ``__init__.py`` with the :class:`Family` entry (space, check,
   render through :mod:`codegen.families.declared`, grid, header part, host_prep).
4. One registry line: the entry in the tuple below and the config type in
   :data:`core.family.CONFIG_TYPES` (or, for a plug-in or a test, one
   :func:`register` call at run time, which does both).

Adding a parameter to a family: one more :func:`~core.config_common.param` field (declare it
``optional`` when results are stored already, so their names, rows and studies stay the same;
a search name's default encoding then fills studies stored before it) and the template's.
"""

from __future__ import annotations

from codegen.families.fa2 import FA2
from codegen.families.fa3 import FA3
from codegen.families.registry import (
    FAMILIES,
    Family,
    Grid,
    HeaderPart,
    HostPrep,
    families_for,
    family,
    family_of,
    register,
    unregister,
)
from codegen.families.splitkv import SPLITKV

# The built-in families (core.family maps their config types already); one line each.
FAMILIES.update({entry.name: entry for entry in (FA2, FA3, SPLITKV)})

__all__ = [
    "FA2",
    "FA3",
    "FAMILIES",
    "SPLITKV",
    "Family",
    "Grid",
    "HeaderPart",
    "HostPrep",
    "families_for",
    "family",
    "family_of",
    "register",
    "unregister",
]
