"""The speculative round: drafting through the model, verification (each kernel beside its PyTorch
reference), the confidence schedule, the draft context caches, the reference loop and the
static-shape engine."""
