"""Points that are not started: the space's rules, the run's learned rules and vLLM's pre-flight;
and a refusal (at pre-flight or at start) learned as a rule of the run (agent.refusals)."""

from __future__ import annotations

from agent import clock, refusals
from agent.context import RefusalCheck, RunContext, Seams
from agent.ledger import LearnedRule, Trial, TrialWrite
from agent.states import Decision, Status


def refusal_check(ctx: RunContext, seams: Seams) -> RefusalCheck | None:
    """vLLM's own config checks for points of this space, or None where they cannot be trusted: the
    engine has none, or they refuse the defaults themselves (which did just start), so a refusal
    would say more about the pre-flight than about the point."""
    engine, space, model = seams.engine, ctx.space, ctx.settings.model
    if not ctx.settings.preflight or not hasattr(engine, "preflight"):
        return None
    answer = engine.preflight(model, *space.to_flags_env({}))
    if not answer or not answer.get("ok"):
        seams.say("preflight_off", reason=(answer or {}).get("message") or "the pre-flight did not answer")
        return None

    def refused(point: dict) -> str | None:
        if space.problems(point):
            return None   # not a point vLLM could be asked about; the space has its own say
        answer = engine.preflight(model, *space.to_flags_env(point))
        return answer["message"] if answer and answer.get("ok") is False else None
    return refused


def excluded(ctx: RunContext, point: dict, rules: list[LearnedRule]) -> TrialWrite | None:
    """Why a point is not started (the row's final values), or None: it goes to a real server."""
    if broken := ctx.space.broken_rules(point):
        return TrialWrite(status=Status.SKIPPED, decision=Decision.SKIPPED,
                          failure_message=f"excluded by the space's rules: {'; '.join(broken)}")
    if rule := refusals.matching(point, rules):
        return TrialWrite(status=Status.SKIPPED, decision=Decision.SKIPPED,
                          failure_message=f"contains learned rule {rule.id} ({refusals.describe(rule.settings)}), "
                                          f"which vLLM refused at {rule.stage} in trial {rule.from_trial}: "
                                          f"{rule.message}")
    started = clock.monotonic()
    if ctx.refusal_check and (message := ctx.refusal_check(point)):
        return TrialWrite(status=Status.FAILED, decision=Decision.FAILED,
                          failure_message=f"refused at pre-flight: {message}",
                    failure_cause=message, failed_phase="preflight",
                    timings={"preflight_s": round(clock.monotonic() - started, 3)})
    return None


def learn(ctx: RunContext, seams: Seams, row: Trial) -> None:
    """A point vLLM refused (at pre-flight or at start) becomes a rule of the run: the smallest set of
    its changes still refused, so no later point that contains it is started."""
    cause = row.failure_cause or row.failure_message or ""
    if row.failure_class != "invalid_config" or row.status != Status.FAILED:
        return
    point, check = row.params, ctx.refusal_check
    stage = "pre-flight" if row.failed_phase == "preflight" else "start"
    changes = {k: point[k] for k in ctx.space.changed(point, ctx.defaults)}
    if not changes:
        return
    replayed = check(point) if check and stage == "start" else None
    if check and (stage == "pre-flight" or (replayed and refusals.same_cause(replayed, cause))):
        settings, checks = refusals.minimise(changes, cause, check)
        how = "minimised at pre-flight"
    else:
        settings, checks = refusals.named(changes, cause) or changes, 0
        how = "named in vLLM's message" if settings != changes else "the whole point"
    rule = seams.ledger.add(LearnedRule(run_id=ctx.run.id, from_trial=row.number, settings=settings,
                                        message=cause[:600], stage=stage, how=how, checks=checks))
    seams.say("learned", number=row.number, rule=rule.id, settings=refusals.describe(settings), how=how)


def facts_for(facts: dict, rules: list[LearnedRule]) -> dict:
    """The planner's facts, with what vLLM refused in this run."""
    if not rules:
        return facts
    return {**facts, "refused_by_vllm_this_run": [f"{refusals.describe(r.settings)}: {r.message[:200]}"
                                                  for r in rules]}
