"""GPU kernels, each with a plain-PyTorch reference of the same signature."""
