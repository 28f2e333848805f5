"""The engine releases whose draft-input layout our exports were checked against, and the ones
known to lay the draft block out otherwise.

A draft is served as trained only when the engine builds its inputs as the trainer does: the
anchor in slot 0 and γ-1 mask tokens after it, at positions p .. p+γ-1; slot k read as the token
at p+k+1 (`sample_from_anchor`); the context from the captured target layers at their own
positions. An engine that builds them otherwise still serves every token correctly
(verification is lossless), but it accepts about one draft token per round, and says nothing.

tests/test_vllm_layout_contract.py and tests/test_sglang_layout_contract.py run the releases in
CHECKED over our exports: the engines' own draft-input code, compiled from their wheels, feeds
a draft overfit on one sequence, which must accept every block (docs/deploy.md#engine-versions).
An export records them in config.json (`splitserve.layout_checked`) and names them above the
serve command it prints. An engine installed where the export runs is looked up (its
distribution's metadata and files, never imported): a release known to build another block gets
a one-line warning, a release never checked a one-line note.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

DOCS = "docs/deploy.md#engine-versions"


@dataclass(frozen=True)
class EngineRelease:
    engine: str  # the distribution's name
    version: str
    checked: str  # what of it ran against our exports


CHECKED = {
    "vllm": EngineRelease(
        "vllm", "0.33.0",
        "update_dspark, get_eagle3_aux_layers_from_config and the Llama capture loop, DSparkSpeculator.propose "
        "with _prepare_dflash_inputs_kernel (Triton interpreter) and the sequential Markov sampling"),
    "sglang": EngineRelease(
        "sglang", "0.5.23",
        "DSPARK config parsing and capture-layer resolution, alloc_verify_window, TargetHiddenKvInjector, "
        "DraftBlockProposer.propose with SGLang's own Markov heads, TargetVerifyExecutor.commit_hidden"),
}

# An EAGLE-3 export has no draft block: what ran against it is the engine's EAGLE-3 config and
# loader code and its capture of the aux layers (tests/test_export_eagle3*.py, docs/deploy.md#eagle-3).
CHECKED_EAGLE3 = {
    "vllm": EngineRelease(
        "vllm", "0.33.0",
        "update_eagle3 and SpeculatorsConfig (config.json -> the draft's config), get_eagle3_aux_layers_from_config "
        "and the Llama capture loop"),
    "sglang": EngineRelease(
        "sglang", "0.5.23",
        "LlamaForCausalLMEagle3 (load_weights, the d2t hot-token map, its forward), _resolve_eagle_aux_hidden_state, "
        "set_eagle3_layers_to_capture and the Llama capture loop"),
}
EAGLE3_DOCS = "docs/deploy.md#eagle-3"

# vLLM builds whose speculators config loader hard-codes the 1+N block (the anchor as a bonus
# token, γ+1 query rows, row k read as the token at p+k) whatever the checkpoint's
# sample_from_anchor says: every slot is then read one token late. Reported for 0.25.2 in public
# serving notes (not read here); any installed build is also checked by its source (below).
BONUS_ANCHOR = "its update_dspark hard-codes dspark_bonus_anchor=True (the 1+N block), ignoring sample_from_anchor"
OTHER_LAYOUT = {("vllm", "0.25.2"): BONUS_ANCHOR}
VLLM_CONFIG_LOADER = "vllm/transformers_utils/configs/speculators/algos.py"  # where update_dspark lives
_BONUS_ANCHOR_HARD_CODED = re.compile(r"""\[\s*["']dspark_bonus_anchor["']\s*\]\s*=\s*True\b""")


def layout_checked(engine: str, family: str = "dspark") -> dict[str, str]:
    """What an export records under config.json's `splitserve` key."""
    r = (CHECKED_EAGLE3 if family == "eagle3" else CHECKED)[engine]
    return {"engine": r.engine, "version": r.version}


def checked_line(engine: str, family: str = "dspark") -> str:
    """The comment printed above the serve command."""
    if family == "eagle3":
        r = CHECKED_EAGLE3[engine]
        return f"# EAGLE-3 layout and captured layers checked against {r.engine}=={r.version} ({EAGLE3_DOCS})"
    r = CHECKED[engine]
    return f"# draft block layout checked against {r.engine}=={r.version} ({DOCS})"


def bonus_anchor_hard_coded(config_loader_source: str) -> bool:
    """Whether a vLLM build's update_dspark source sets dspark_bonus_anchor to a constant True."""
    return bool(_BONUS_ANCHOR_HARD_CODED.search(config_loader_source))


def layout_warning(engine: str, version: str | None, config_loader_source: str | None = None,
                   family: str = "dspark") -> str | None:
    """One line about serving with `engine` `version` (None: not installed); None when there is
    nothing to say (the checked release, or no engine). An EAGLE-3 draft has no block to build
    late: only a release other than the checked one is noted."""
    if version is None:
        return None
    if family == "eagle3":
        checked = CHECKED_EAGLE3[engine].version
        if version == checked:
            return None
        return (f"note: the installed {engine} {version} is not the release this EAGLE-3 export was checked against "
                f"({engine}=={checked}); {EAGLE3_DOCS} says what was checked")
    pin = f"{engine}=={CHECKED[engine].version}"
    why = OTHER_LAYOUT.get((engine, version))
    if why is None and engine == "vllm" and config_loader_source and bonus_anchor_hard_coded(config_loader_source):
        why = BONUS_ANCHOR  # any build, whatever its version says
    if why:
        return (f"warning: {engine} {version} would serve this draft one slot late, accepting about one token per "
                f"round: {why}; serve it with {pin}")
    if version != CHECKED[engine].version:
        return (f"note: the installed {engine} {version} is not the release this draft's block layout was checked "
                f"against ({pin}); {DOCS} says how to check another")
    return None


def installed(engine: str) -> tuple[str | None, str | None]:
    """(version, update_dspark's file for vLLM) of the engine installed here, or (None, None)."""
    try:
        dist = metadata.distribution(engine)
    except metadata.PackageNotFoundError:
        return None, None
    source = None
    if engine == "vllm":
        try:
            source = Path(dist.locate_file(VLLM_CONFIG_LOADER)).read_text()
        except OSError:
            pass
    return dist.version, source


def installed_warning(engine: str, family: str = "dspark") -> str | None:
    """layout_warning for the engine installed where the export runs."""
    return layout_warning(engine, *installed(engine), family=family)
