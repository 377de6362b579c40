"""fa2tune stage package: service."""
