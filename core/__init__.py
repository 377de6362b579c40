"""Shared value types every stage imports; this package imports no stage."""
