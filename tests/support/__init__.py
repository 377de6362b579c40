"""Helpers the tests import by package path (``tests.support.factories`` ...); no tests here."""
