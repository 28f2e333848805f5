"""splitserve: train DSpark speculative-decoding drafts against a frozen target, and serve them.

Importing the package loads nothing heavy (no torch, no transformers): each command imports what
it needs. `import splitserve.export` registers the exported draft's classes with transformers'
Auto classes (splitserve/export/hf.py).
"""

__version__ = "0.1.0"
