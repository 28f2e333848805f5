"""Exports of a trained draft: Hugging Face, vLLM (speculators) and SGLang layouts.

Importing this package registers the HF classes with transformers' Auto classes."""

from splitserve.export.export import export_draft
from splitserve.export.hf import DSparkConfig, DSparkDraftModel, register
from splitserve.export.sglang import export_sglang
from splitserve.export.speculators import export_speculators

__all__ = ["DSparkConfig", "DSparkDraftModel", "export_draft", "export_sglang", "export_speculators", "register"]

register()
