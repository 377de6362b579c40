"""fa2tune stage package: tuner."""
