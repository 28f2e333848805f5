"""Offline hidden-state dumps: write a target's `HiddenRecord`s once, train drafts from disk."""

from splitserve.offline.reader import FORMAT, MANIFEST_NAME, DumpError, DumpReader
from splitserve.offline.writer import DumpWriter

__all__ = ["FORMAT", "MANIFEST_NAME", "DumpError", "DumpReader", "DumpWriter"]
