"""No worse, for a lossless config: greedy outputs equivalent to the defaults' up to numerics.

A near-tie flip (the candidate's token was within tau of the reference's top-1) is numerics; more
flips than the defaults' own instances show, a flip beyond tau, or a KL divergence on the shared
prefix above theirs is the config's. tau, the flip allowance and the KL bound are calibrated on the
defaults' server instances (`calibrate`) and proven by the A/A check (agent.gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# bf16 keeps 8 significant bits, so a logit in [16, 32), where this model's top logits sit, moves
# in steps of 1/8: a change of kernel, batch shape or reduction order moves a logit by about one
# step, so a near-tie within one step is numerics, and beyond two it is the config's. (Every
# near-tie flip measured so far was at 0 or 1/8 nats: docs/meters-and-gate.md.)
TAU_FLOOR = 1 / 8
TAU_CAP = 1 / 4
KL_FLOOR = 0.002    # nats: the mean KL a reordered reduction leaves on the shared prefix (see docs)


@dataclass(frozen=True)
class Flip:
    """Where a greedy output first leaves the reference path, and by how much it was a near-tie."""
    prompt: int
    position: int
    reference: int
    candidate: int
    margin: float | None   # reference top-1 logprob minus the candidate token's, in the reference's
                           # own distribution; None when the candidate's token is outside its top-k

    def within(self, tau: float) -> bool:
        return self.margin is not None and self.margin <= tau

    def describe(self) -> str:
        gap = f"{self.margin:.3f} nats below" if self.margin is not None else "outside the top-k of"
        return (f"prompt {self.prompt}, position {self.position}: token {self.candidate} instead of "
                f"{self.reference}, {gap} the reference's top-1")

    def as_dict(self) -> dict:
        return {"prompt": self.prompt, "position": self.position, "reference": self.reference,
                "candidate": self.candidate, "margin": self.margin}


def _logprob(top: dict | None, token: int) -> float | None:
    return None if not top else top.get(str(token))


def flips(ref_ids: list[list[int]], ref_tops: list | None, ids: list[list[int]]) -> list[Flip]:
    """Each prompt's first divergence from the reference path (contexts differ after it)."""
    out = []
    for prompt, (want, got) in enumerate(zip(ref_ids, ids, strict=False)):
        position = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
        if position is None:
            continue
        top = (ref_tops[prompt] or [None] * len(want))[position] if ref_tops and ref_tops[prompt] else None
        best, theirs = _logprob(top, want[position]), _logprob(top, got[position])
        margin = round(best - theirs, 5) if best is not None and theirs is not None else None
        out.append(Flip(prompt, position, want[position], got[position], margin))
    return out


def agreement(baseline: list[list[int]], candidate: list[list[int]]) -> float:
    """Mean share of each baseline greedy output that the candidate reproduces before diverging."""
    if not baseline or len(baseline) != len(candidate):
        return 0.0
    shares = []
    for want, got in zip(baseline, candidate, strict=False):
        same = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
        shares.append(same / max(len(want), 1))
    return round(sum(shares) / len(shares), 4)


def kl_divergence(base: list | None, cand: list | None, base_ids: list[list[int]],
                  cand_ids: list[list[int]]) -> float | None:
    """Mean KL(reference || candidate) over generated positions whose context is still shared.

    Each side gives only its top-k, so both are renormalised over the union of their tokens, a
    token missing from one side taking that side's smallest logprob (an upper bound on its mass
    there). Positions after the outputs diverge are left out: their contexts differ.
    """
    if not base or not cand or len(base) != len(cand):
        return None
    total, n = 0.0, 0
    for b_prompt, c_prompt, b_ids, c_ids in zip(base, cand, base_ids, cand_ids, strict=False):
        if not b_prompt or not c_prompt:
            return None
        for position, (b, c) in enumerate(zip(b_prompt, c_prompt, strict=False)):
            if position > 0 and b_ids[position - 1] != c_ids[position - 1]:
                break
            tokens = set(b) | set(c)
            pb = {t: math.exp(b.get(t, min(b.values()))) for t in tokens}
            pc = {t: math.exp(c.get(t, min(c.values()))) for t in tokens}
            zb, zc = sum(pb.values()), sum(pc.values())
            total += sum(pb[t] / zb * math.log((pb[t] / zb) / (pc[t] / zc)) for t in tokens)
            n += 1
    return round(max(total / n, 0.0), 6) if n else None


@dataclass(frozen=True)
class Calibration:
    """What a lossless config may show: measured on the defaults' instances, proven by the A/A."""
    tau: float                # nats: a divergence within tau of the reference's top-1 is numerics
    flips_allowed: int        # numerical flips a lossless config may show over the greedy prompts
    kl_bound: float           # mean KL on the shared prefix
    rule: str                 # "calibrated" (near-ties tolerated) or "exact" (token for token)
    reason: str

    def as_dict(self) -> dict:
        return {"tau": self.tau, "flips_allowed": self.flips_allowed, "kl_bound": self.kl_bound,
                "rule": self.rule, "reason": self.reason}


def flip_allowance(seen: int) -> int:
    """Numerical flips a config may show beyond the most the defaults' instances showed (seen).

    Near-tie flips are rare independent events, so a count of them is about Poisson: the
    difference of two counts with mean k has a standard deviation near sqrt(2k), and two of those
    (at least 2 flips when the defaults showed none) is what a config with the defaults' numerics
    stays within. One that flips many more prompts than that is moving the distribution."""
    return math.ceil(2 * math.sqrt(2 * max(seen, 0.5)))


def calibrate(reference: dict, others: list[dict], exact: bool = False) -> Calibration:
    """tau, the flip allowance and the KL bound from the defaults' instances compared with the first.

    reference and others: {"ids": [[...]], "tops": [[{id: logprob}]]} per server instance.
    """
    if exact:
        return Calibration(0.0, 0, 0.0, "exact", "batch-invariant serving: outputs must match token for token")
    seen = [flips(reference["ids"], reference["tops"], o["ids"]) for o in others]
    margins = [f.margin for fs in seen for f in fs]
    kls = [k for o in others if (k := kl_divergence(reference["tops"], o["tops"], reference["ids"], o["ids"]))
           is not None]
    most = max((len(fs) for fs in seen), default=0)
    kl_bound = round(max(KL_FLOOR, 2 * max(kls, default=0.0)), 6)
    allowed = most + flip_allowance(most)
    if not margins:
        return Calibration(TAU_FLOOR, allowed, kl_bound, "calibrated",
                           f"the defaults' {len(others) + 1} instances agreed token for token: tau at its floor")
    if any(m is None for m in margins):
        return Calibration(TAU_CAP, allowed, kl_bound, "calibrated",
                           "the defaults' instances flipped outside each other's top-k: tau at its cap")
    widest = max(m for m in margins if m is not None)
    tau = min(TAU_CAP, max(TAU_FLOOR, 2 * widest))
    return Calibration(round(tau, 5), allowed, kl_bound, "calibrated",
                       f"the defaults' instances flipped {len(margins)} time(s), at margins up to "
                       f"{widest:.3f} nats: tau twice that, within [{TAU_FLOOR}, {TAU_CAP}]")


def greedy_check(reference: dict, candidate: dict, cal: Calibration) -> tuple[list[str], list[Flip], float | None]:
    """Why a lossless config's greedy outputs are not equivalent to the reference's, its flips, its KL."""
    found = flips(reference["ids"], reference["tops"], candidate["ids"])
    kl = kl_divergence(reference["tops"], candidate["tops"], reference["ids"], candidate["ids"])
    reasons = []
    if len(candidate["ids"]) != len(reference["ids"]):
        return ["broken lossless claim: the greedy outputs do not cover the reference's prompts"], found, kl
    if cal.rule == "exact":
        if found:
            reasons.append(f"broken lossless claim (exact rule): {found[0].describe()}")
        return reasons, found, kl
    clear = [f for f in found if not f.within(cal.tau)]
    if clear:
        reasons.append(f"broken lossless claim: {clear[0].describe()} (tau {cal.tau:.3f})"
                       + (f"; {len(clear) - 1} more" if len(clear) > 1 else ""))
    elif len(found) > cal.flips_allowed:
        reasons.append(f"broken lossless claim: {len(found)} of {len(reference['ids'])} prompts flip at near-ties, "
                       f"more than the {cal.flips_allowed} the defaults' instances allow")
    if kl is not None and kl > cal.kl_bound:
        reasons.append(f"broken lossless claim: KL divergence {kl:.4f} nats on the shared prefix, above the "
                       f"{cal.kl_bound:.4f} the defaults' instances show")
    return reasons, found, kl
