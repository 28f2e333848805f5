"""The native decoder: the serving engine's static-cache target forward, for the Llama family.

support.py decides from the config which targets it serves; weights.py packs their weights
(q|k|v and gate|up in one product each; optional weight-only FP8); decoder.py is the forward;
target.py wraps a transformers target with it. Kernels sit beside their PyTorch references:
linear.py / linear_kernel.py (the weight product), attention.py / attention_kernel.py
(attention over the cache for a few queries), pointwise.py / pointwise_kernel.py (the residual add
with RMSNorm, RoPE with the cache write, SiLU-mul).
"""
