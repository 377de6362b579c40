"""Settings overridden for a block of a test, restored after it (core.settings' overrides)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def settings_overridden(**values: object) -> Iterator[None]:
    """``core.settings.override_settings(**values)`` inside the block; the overrides as they
    were after it, whatever the block raised."""
    from core import settings as settings_module
    from core.settings import override_settings

    saved = dict(settings_module._overrides)
    try:
        override_settings(**values)
        yield
    finally:
        settings_module._overrides.clear()
        settings_module._overrides.update(saved)
