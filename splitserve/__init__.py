"""splitserve: train DSpark speculative-decoding drafts against a frozen target, and serve them."""

__version__ = "0.1.0"


def _register_hf() -> None:
    # `import splitserve` makes exported drafts loadable through transformers' Auto classes.
    try:
        from splitserve.export.hf import register
    except ImportError:  # transformers missing: the core still imports
        return
    register()


_register_hf()
