"""The block a training run ends with: where its files are, what the table says, what to run next."""

from __future__ import annotations

from pathlib import Path

from splitserve.config import RunConfig, ServerConfig

GLOSSARY = (
    "τ (tau)   tokens committed per target forward (accepted draft tokens + the target's own), measured by "
    "real speculative decoding; 1.0 = no speed-up, γ+1 = every block accepted",
    "a1..aγ    acceptance by position: of the rounds that reached draft position k, the share where the "
    "target accepted that token",
    "exact     prompts whose speculative output equals the target's own greedy output (lossless; - : not checked)",
    "rounds    target verify forwards; tokens: tokens generated over all prompts",
)
STS = ("STS       the confidence head's per-position temperatures, fitted on these rounds (calibration.json): "
       "ECE is how far its predicted acceptance is from the measured one, before -> after")


def closing_block(cfg: RunConfig, gamma: int, calibrated: bool) -> str:
    """Printed after the held-out table of `splitserve train`."""
    run = Path(cfg.run_dir)
    export = Path("exports") / run.name
    lines = ["", "What this run left:",
             f"  run        {run}/ (config.yaml, metrics.jsonl, eval.md, eval.json, acceptance.png)",
             f"  the draft  {run}/checkpoints/ (the commands below take the run directory as the draft)",
             "", f"The table (γ = {gamma} draft tokens a round):"]
    lines += [f"  {line}" for line in GLOSSARY + ((STS,) if calibrated else ())]
    lines += ["", "Next:",
              f"  splitserve eval --draft {run} --num-prompts 50   # measure it on more prompts",
              f"  splitserve export {run} {export} --format speculators   # for vLLM; --format sglang for SGLang",
              f"  splitserve serve --draft {run}   # an OpenAI-compatible server on "
              f"{ServerConfig.host}:{ServerConfig.port}",
              "Train longer: the same command with train.max_steps=5000 train.max_minutes=60 resumes this run "
              "for up to 60 more minutes (docs/results/README.md "
              "has GPU recipes)."]
    return "\n".join(lines)
