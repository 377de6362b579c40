"""The test suite; its packages mirror the product's (see docs/architecture.md)."""
