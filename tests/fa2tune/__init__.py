"""Test package (keeps same-named test modules apart)."""
