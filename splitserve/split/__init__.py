"""Split training's orchestration: one torchrun job whose target ranks stream `HiddenRecord`s to
draft-training ranks (the channels themselves live in splitserve/stream)."""
