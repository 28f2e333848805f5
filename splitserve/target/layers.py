"""Which target layers the draft is conditioned on (DSPARK.md, "KV injection")."""

from __future__ import annotations

import math


def default_layer_ids(num_layers: int, m: int = 5) -> list[int]:
    """Spread m captured layers over a target of N layers, never using the last one.

    l_i = round(1 + i * (N - 4) / (m - 1)), i = 0..m-1; Qwen3-8B (N=36) gives [1, 9, 17, 25, 33].
    Halves round up (not Python's banker's rounding) so the rule is the same in every language.
    """
    if m < 1:
        raise ValueError(f"need at least one captured layer, got m={m}")
    if num_layers < 2:
        raise ValueError(f"a target needs at least 2 layers to capture from, got {num_layers}")
    if m == 1:
        return [min(1, num_layers - 2)]
    ids = [math.floor(1 + i * (num_layers - 4) / (m - 1) + 0.5) for i in range(m)]
    ids = [min(max(i, 0), num_layers - 2) for i in ids]  # tiny targets: stay below the last
    return ids


def check_layer_ids(layer_ids: list[int], num_layers: int) -> None:
    from splitserve.errors import UserError  # target.layer_ids is the user's setting

    if not layer_ids:
        raise UserError("target.layer_ids is empty")
    bad = [i for i in layer_ids if not 0 <= i < num_layers - 1]
    if bad:
        raise UserError(
            f"target.layer_ids {bad} out of range for a {num_layers}-layer target "
            f"(valid: 0..{num_layers - 2}; the last layer is never captured)"
        )
