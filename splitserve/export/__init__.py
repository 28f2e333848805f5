from splitserve.export.export import export_draft
from splitserve.export.hf import DSparkConfig, DSparkDraftModel, register

__all__ = ["DSparkConfig", "DSparkDraftModel", "export_draft", "register"]
