"""The kernel families: the registry (:mod:`codegen.families.registry`) and the built-in ones.

Each family is a folder here (its space, host preparation and registry entry); this module
registers the built-in ones, one line each, in the order a campaign searches them. Stages
use the names re-exported here (:class:`Family`, :class:`HeaderPart`, :func:`family`,
:func:`family_of`, :func:`families_for`, :data:`FAMILIES`, :func:`register`).
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
