"""fa2tune stage package: codegen."""
