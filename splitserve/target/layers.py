"""Which target layers the draft is conditioned on (DSPARK.md, "KV injection").

`target.layer_ids` names them; unset, `target.layer_rule` picks them:
    spread  `target.num_capture_layers` layers spread over the target (default_layer_ids); DSpark's
    eagle3  EAGLE-3's usual low, middle and high layers [1, N//2 - 1, N - 4] (models/eagle3.py
            eagle3_layer_ids), which conf/draft/eagle3.yaml selects
    last    the last layer alone, [N - 1]: the target's own MTP head reads its output after the
            final norm (models/mtp.py; conf/draft/mtp.yaml). Only this rule captures the last
            layer (`check_layer_ids`); a draft family that cannot use it is refused at build.
Ids are our capture's: the output of layer l (HF hidden_states[l + 1]).
"""

from __future__ import annotations

import math


def default_layer_ids(num_layers: int, m: int = 5) -> list[int]:
    """Spread m captured layers over a target of N layers, never using the last one.

    l_i = round(1 + i * (N - 4) / (m - 1)), i = 0..m-1; Qwen3-8B (N=36) gives [1, 9, 17, 25, 33].
    Halves round up (not Python's banker's rounding) so the rule is the same in every language.
    On a small target the rule can give a layer twice (N=4: [1, 1, 1, 1, 1]); `check_layer_ids`
    refuses that, and `max_default_layers` says how many it can spread without a repeat.
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


LAYER_RULES = ("spread", "eagle3", "last")


def rule_layer_ids(num_layers: int, m: int = 5, rule: str = "spread") -> list[int]:
    """The layers a named rule captures from an N-layer target. `m` is the spread rule's count;
    the eagle3 rule always names three. A rule that cannot fit the target is one UserError."""
    from splitserve.errors import UserError  # target.layer_rule is the user's setting

    if rule == "spread":
        return default_layer_ids(num_layers, m)
    if rule == "last":
        return [num_layers - 1]
    if rule != "eagle3":
        raise UserError(f"target.layer_rule={rule!r}: must be one of {', '.join(LAYER_RULES)}")
    from splitserve.models.eagle3 import eagle3_layer_ids  # models sits below target

    ids = eagle3_layer_ids(num_layers) if num_layers >= 6 else None
    if ids is None or repeated(ids):
        found = f"gives {ids}, repeating layer(s) {repeated(ids)}" if ids else "needs at least 6 layers"
        raise UserError(f"target.layer_rule=eagle3 does not fit a {num_layers}-layer target: [1, N//2 - 1, N - 4] "
                        f"{found}; set target.layer_ids=[...] with distinct ids in 0..{num_layers - 2}, "
                        "or target.layer_rule=spread")
    return ids


def capture_layer_ids(target_cfg, num_layers: int) -> list[int]:
    """What a TargetConfig captures from an N-layer target: target.layer_ids when set, else
    target.layer_rule's layers (unchecked; `check_layer_ids` refuses what a target cannot give)."""
    if target_cfg.layer_ids is not None:
        return list(target_cfg.layer_ids)
    return rule_layer_ids(num_layers, target_cfg.num_capture_layers, target_cfg.layer_rule)


def max_default_layers(num_layers: int) -> int:
    """The largest m for which the default rule gives m distinct layers of an N-layer target
    (N - 3 from N = 5 on: the rule spreads over layers 1..N-3)."""
    fits = [m for m in range(1, num_layers) if len(set(default_layer_ids(num_layers, m))) == m]
    return max(fits, default=1)


def repeated(layer_ids: list[int]) -> list[int]:
    """The ids that occur more than once, ascending."""
    return sorted({i for i in layer_ids if layer_ids.count(i) > 1})


def check_layer_ids(layer_ids: list[int], num_layers: int, from_rule: bool | None = None,
                    allow_last: bool = False) -> None:
    """Refuse captured layers a target cannot give: none, one out of range, or one twice (a
    repeat adds no information, and SGLang and vLLM capture each layer once). The last layer is
    out of range unless `allow_last` (target.layer_rule=last).

    `from_rule`: the ids are the default rule's (target.layer_ids unset), which the message then
    names with target.num_capture_layers; None: taken to be so when they equal what the rule
    gives for that many layers (callers that do not know where the ids came from)."""
    from splitserve.errors import UserError  # target.layer_ids is the user's setting

    if not layer_ids:
        raise UserError("target.layer_ids is empty")
    top = num_layers if allow_last else num_layers - 1
    bad = [i for i in layer_ids if not 0 <= i < top]
    if bad:
        raise UserError(
            f"target.layer_ids {bad} out of range for a {num_layers}-layer target "
            f"(valid: 0..{top - 1}; the last layer is captured only by target.layer_rule=last)"
        )
    twice = repeated(list(layer_ids))
    if not twice:
        return
    ids, m = list(layer_ids), len(layer_ids)
    if from_rule is None:
        from_rule = ids == default_layer_ids(num_layers, m)
    fix = (f"set target.num_capture_layers=K with K <= {max_default_layers(num_layers)}, or "
           f"target.layer_ids=[...] with distinct ids in 0..{num_layers - 2}")
    if from_rule:
        raise UserError(
            f"target.num_capture_layers={m} does not fit a {num_layers}-layer target: the default capture rule "
            f"gives layer ids {ids}, repeating layer(s) {twice}; {fix}"
        )
    raise UserError(f"target.layer_ids {ids} repeat layer(s) {twice} of a {num_layers}-layer target; {fix}")
