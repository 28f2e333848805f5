"""Measuring drafts: acceptance (τ) against the real target, held-out evaluation during training,
confidence calibration, the serving benchmark, and sweep reports."""
