"""Readers of the standard on-disk dataset layouts, one file per format.

Each exposes ``load_<name>(root: Path) -> DatasetParts`` (see :mod:`.common`); the registry
(:mod:`kdml.data.registry`) finds the root and imports a reader only when it is used.
"""
