"""fa2tune stage package: db."""
