"""Runs composed from a typed run config: run directory, options files, presets, front doors."""
