"""The gate's rules, deterministic: greedy equivalence up to near-ties, the A/A check, the
sequential held-out decision, and the statistics under them."""

import math

import pytest

from agent import gate
from agent import greedy as equivalence
from agent.gate import GateSettings, Instance, MeasureFailed, baseline_of, check, judge_aa, sequential_test
from agent.stats import compare, pooled_noise, t_quantile
from sandbox.result import Figures, Quality, TrialResult, failed

IDS = [[10 + p, 20 + p, 30 + p, 40 + p] for p in range(8)]


def tops(ids, tie_at=None, margin=0.125):
    """Each position's top-2 by token id; at tie_at (prompt, position) the runner-up is margin below."""
    out = []
    for p, g in enumerate(ids):
        row = [{str(t): -0.05, str(t + 100): -3.0} for t in g]
        if tie_at and tie_at[0] == p:
            at = tie_at[1]
            row[at] = {str(g[at]): -1.0, str(g[at] + 100): -1.0 - margin}
        out.append(row)
    return out


def greedy(ids, tie_at=None, margin=0.125, take_runner_up=False):
    ids = [list(g) for g in ids]
    if take_runner_up:
        ids[tie_at[0]][tie_at[1]] += 100
    return {"ids": ids, "tops": tops(ids, tie_at, margin)}


def result(tps, g, ppl=8.0, ttft=50.0, itl=40.0, tpot=None, e2e=None):
    """A candidate instance's figures; its TPOT and end-to-end p99s are not measured unless given."""
    return TrialResult(bench=Figures(tps=tps, ttft_ms={"p99": ttft}, itl_ms={"p99": itl},
                                     tpot_ms={"p99": tpot} if tpot else {}, latency_ms={"p99": e2e} if e2e else {}),
                       quality=Quality(ppl=ppl, greedy=[{"token_ids": i, "top_logprobs": t}
                                                        for i, t in zip(g["ids"], g["tops"], strict=False)]))


def steady_base(n=3, tps=(10.0, 10.3, 9.8), g=None):
    g = g or greedy(IDS)
    return baseline_of([Instance(t, t * 0.97, 8.0, g) for t in tps[:n]], GateSettings())


def test_t_quantiles_match_the_tables():
    assert t_quantile(0.975, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.975, 2) == pytest.approx(4.303, abs=1e-3)
    assert t_quantile(0.95, 5) == pytest.approx(2.015, abs=5e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.228, abs=5e-3)
    assert t_quantile(0.99, 30) == pytest.approx(2.457, abs=5e-3)


def test_noise_is_pooled_on_the_log_scale_over_groups_and_bounds_widen_with_it():
    noise = pooled_noise([[10.0, 11.0], [20.0, 22.0, 21.0], [5.0]])
    assert noise.df == 3 and 0.04 < noise.sd < 0.08
    assert pooled_noise([[10.0]]).df == 0
    tight = compare([13.0], [10.0, 10.1, 9.9], pooled_noise([[10.0, 10.1, 9.9]]))
    loose = compare([13.0], [10.0, 11.0, 9.0], pooled_noise([[10.0, 11.0, 9.0]]))
    assert tight.low > 1.2 and loose.low < tight.low and tight.ratio == pytest.approx(1.3, rel=1e-3)
    # No degrees of freedom: no estimate of the noise, so no bound is claimed.
    assert compare([13.0], [10.0], pooled_noise([[10.0]])).low == 0.0


def test_near_tie_flips_within_tau_are_numerics_and_accepted_as_lossless():
    ref = greedy(IDS, tie_at=(3, 2), margin=0.05)
    base = steady_base(g=ref)
    assert base.calibration.tau == equivalence.TAU_FLOOR and base.calibration.flips_allowed == 2
    near = greedy(IDS, tie_at=(3, 2), margin=0.05, take_runner_up=True)
    verdict = check(result(14.0, near), base, lossless=True)
    assert verdict.passed, verdict.reasons
    (flip,) = verdict.flips
    assert (flip.prompt, flip.position, flip.reference, flip.candidate) == (3, 2, 33, 133)
    assert flip.margin == pytest.approx(0.05) and flip.within(base.calibration.tau)


def test_a_flip_at_a_clear_margin_is_refused_naming_prompt_position_tokens_and_margin():
    ref = greedy(IDS, tie_at=(3, 2), margin=0.9)
    base = steady_base(g=ref)
    flipped = greedy(IDS, tie_at=(3, 2), margin=0.9, take_runner_up=True)
    verdict = check(result(14.0, flipped), base, lossless=True)
    assert not verdict.passed and not verdict.quality_ok
    assert "prompt 3, position 2: token 133 instead of 33, 0.900 nats below" in verdict.reasons[0]
    # A token outside the reference's top-k is a clear flip too.
    outside = greedy(IDS)
    outside["ids"][5][1] = 999
    verdict = check(result(14.0, outside), base, lossless=True)
    assert "outside the top-k" in verdict.reasons[0]
    # A lossy config is not held to greedy equivalence (perplexity and its KL bound still are).
    assert check(result(14.0, outside), base, lossless=False, settings=GateSettings(kl_max_lossy=1.0)).passed
    assert "the bound for lossy configs" in check(result(14.0, outside), base, lossless=False).reasons[0]


def test_a_config_that_flips_every_near_tie_is_not_lossless():
    ids = IDS
    ref = {"ids": ids, "tops": [[{str(t): -1.0, str(t + 100): -1.02} for t in g] for g in ids]}
    base = steady_base(g=ref)
    every = {"ids": [[g[0] + 100] + g[1:] for g in ids], "tops": ref["tops"]}
    verdict = check(result(14.0, every), base, lossless=True)
    assert not verdict.passed and "8 of 8 prompts flip at near-ties" in verdict.reasons[0]


def test_tau_is_calibrated_from_the_defaults_own_flips_with_a_floor_and_a_cap():
    ref = greedy(IDS, tie_at=(2, 1), margin=0.1)
    other = greedy(IDS, tie_at=(2, 1), margin=0.1, take_runner_up=True)
    cal = equivalence.calibrate(ref, [other])
    assert cal.tau == pytest.approx(0.2) and cal.flips_allowed == 1 + equivalence.flip_allowance(1)
    wide = equivalence.calibrate(greedy(IDS, tie_at=(2, 1), margin=0.3),
                          [greedy(IDS, tie_at=(2, 1), margin=0.3, take_runner_up=True)])
    assert wide.tau == equivalence.TAU_CAP
    assert equivalence.calibrate(ref, [ref]).tau == equivalence.TAU_FLOOR
    exact = equivalence.calibrate(ref, [other], exact=True)
    assert exact.rule == "exact" and exact.tau == 0.0


def test_the_exact_rule_refuses_any_divergence():
    ref = greedy(IDS, tie_at=(3, 2))
    base = baseline_of([Instance(t, t, 8.0, ref) for t in (10.0, 10.3, 9.8)], GateSettings(exact=True))
    near = greedy(IDS, tie_at=(3, 2), margin=0.01, take_runner_up=True)
    verdict = check(result(14.0, near), base, lossless=True, settings=GateSettings(exact=True))
    assert not verdict.passed and "exact rule" in verdict.reasons[0]


def test_aa_passes_on_a_steady_engine_and_is_reported_when_it_fails():
    base = steady_base()
    fine = judge_aa(Instance(10.1, 9.8, 8.0, greedy(IDS)), base, GateSettings())
    assert fine.passed and fine.line.startswith("A/A check: no loss, no gain") and not fine.add_instances
    # A near-tie flip wider than tau: tau widens to cover it (up to the cap), and the run says so.
    tie = greedy(IDS, tie_at=(1, 1), margin=0.2)
    base = steady_base(g=tie)
    widened = judge_aa(Instance(10.1, 9.8, 8.0, greedy(IDS, tie_at=(1, 1), margin=0.2, take_runner_up=True)),
                       base, GateSettings())
    assert not widened.passed and "tau widened to 0.200" in widened.line and widened.calibration.tau == 0.2
    # The defaults called faster than themselves: more instances of them before any candidate.
    fast = judge_aa(Instance(14.0, 13.0, 8.0, greedy(IDS)), steady_base(), GateSettings())
    assert not fast.passed and fast.add_instances and "faster than themselves" in fast.line
    assert gate.more_defaults_wanted(steady_base(), fast, 0, GateSettings())


def test_a_straddling_interval_measures_more_instances_then_decides():
    base = steady_base(tps=(10.0, 10.6, 9.5))
    measured = {"candidate": 0, "defaults": 0}

    def more(kind, value):
        def measure():
            measured[kind] += 1
            return value
        return measure

    # A first held-out instance that alone cannot tell 1.12x from 1.0x on this noise...
    decision = sequential_test(11.2, base, GateSettings(), more("candidate", 11.6), more("defaults", 9.9))
    assert measured["candidate"] >= 1 and len(decision.candidate) == 1 + measured["candidate"]
    assert measured["defaults"] == len(decision.extra_defaults)
    # ...is decided once more instances are in: here accepted, with the bound that cleared.
    assert decision.accepted and decision.comparison.low > 1 and "clears 1.000" in decision.reasons[0]
    # A config without a gain is refused, after few instances.
    none = sequential_test(9.5, base, GateSettings(), lambda: 9.6, lambda: 9.8)
    assert not none.accepted and len(none.candidate) < 4 and "favours no gain" in none.reasons[0]
    # Once the candidate has as many instances as the defaults, both get more: balanced arms.
    measured.update(candidate=0, defaults=0)
    slow = sequential_test(10.3, base, GateSettings(max_instances=6), more("candidate", 10.9), more("defaults", 10.0))
    assert measured["defaults"] == len(slow.extra_defaults) >= 1 and len(slow.candidate) >= 4
    # A failed instance ends the decision with its reason.

    def broken():
        raise MeasureFailed("a held-out instance failed: crashed")

    failed = sequential_test(11.2, base, GateSettings(), broken, lambda: 10.0)
    assert not failed.accepted and "crashed" in failed.reasons[0]


def test_constraint_is_infeasible_for_quality_refusals_and_feasible_for_slow_configs():
    base = steady_base()
    slow = check(result(9.0, greedy(IDS)), base, lossless=True)
    assert not slow.passed and slow.quality_ok and gate.constraint(slow, result(9.0, greedy(IDS)), GateSettings()) == 0
    worse = check(result(14.0, greedy(IDS), ppl=9.0), base, lossless=True)
    assert gate.constraint(worse, result(14.0, greedy(IDS), ppl=9.0), GateSettings()) == 1.0
    slo = GateSettings(slo_ttft_p99_ms=100)
    late = result(14.0, greedy(IDS), ttft=150.0)
    assert gate.constraint(check(late, base, True, slo), late, slo) == pytest.approx(0.5)
    crashed = failed("crashed", "server stopped answering")
    assert gate.constraint(check(crashed, base, True), crashed, GateSettings()) == 1.0


def test_lossy_configs_are_held_to_a_kl_bound_by_default_and_kl_max_overrides_it():
    base = steady_base()
    shifted = greedy(IDS)
    for row in shifted["tops"]:          # every position's distribution moved: top-1 less sure of itself
        for d in row:
            first, second = list(d)
            d[first], d[second] = -0.5, -1.0
    lossy = check(result(13.0, shifted), base, lossless=False)
    assert not lossy.passed and "(the bound for lossy configs)" in lossy.reasons[0] and lossy.kl > 0.05
    # the same figures from a lossless knob are judged by the greedy rule, not the lossy KL bound
    assert not any("lossy" in r for r in check(result(13.0, shifted), base, lossless=True).reasons)
    assert check(result(13.0, shifted), base, lossless=False, settings=GateSettings(kl_max=10.0)).passed


def test_the_held_out_decision_uses_only_instances_of_the_defaults_that_did_not_screen_the_candidate():
    base = steady_base()
    assert base.heldout == []          # the baseline instances screen; the decision measures its own
    measured = []

    def more_defaults():
        measured.append(10.0)
        return 10.0

    d = sequential_test(14.0, base, GateSettings(), lambda: 14.0, more_defaults)
    assert measured and d.extra_defaults == measured and d.comparison.defaults == len(measured)


def test_the_aa_instance_serves_held_out_decisions_and_stays_out_of_the_screen():
    g = greedy(IDS)
    first = [Instance(10.0, None, 8.0, g), Instance(10.1, None, 8.0, g)]
    base = baseline_of(first, GateSettings(), aa=Instance(9.9, 9.6, 8.0, g))
    # The screen compares with the two baseline instances alone: a slow A/A cannot make a candidate
    # look faster on the search prompts, and its held-out figure is independent of the screen.
    assert base.search == [10.0, 10.1] and base.figure == pytest.approx(math.sqrt(10.0 * 10.1))
    assert base.heldout == [9.6] and base.unscreened == (9.9,)
    # Its search figure is one more instance of the defaults in the noise (2 degrees of freedom, not 1).
    assert base.noise.df == 2 and base.noise == pooled_noise([[10.0, 10.1, 9.9]])
    measured = []
    d = sequential_test(13.0, base, GateSettings(), lambda: 13.0, lambda: measured.append(9.6) or 9.6)
    # A clear gain is decided on one fresh instance of the candidate, against the A/A's held-out figure.
    assert d.accepted and measured == [] and d.comparison.defaults == 1 and d.candidate == [13.0]


def test_a_noise_prior_counts_as_degrees_of_freedom_at_its_own_spread_and_fades_as_instances_come():
    prior = gate.Noise(0.06, 6)
    assert pooled_noise([], prior).df == 6 and pooled_noise([], prior).sd == pytest.approx(0.06)
    few = pooled_noise([[10.0, 10.9, 9.2]], prior)           # a noisy machine's 2 df, log-sd about 0.085
    alone = pooled_noise([[10.0, 10.9, 9.2]])
    assert few.df == 8 and prior.sd < few.sd < alone.sd
    many = pooled_noise([[10.0, 10.9, 9.2] * 10], prior)       # 29 df of the machine's own spread
    assert abs(many.sd - pooled_noise([[10.0, 10.9, 9.2] * 10]).sd) < abs(few.sd - alone.sd)
    # The bounds narrow with the degrees of freedom, not only with the spread.
    assert compare([13.0], [10.0], few).low > compare([13.0], [10.0], alone).low


def test_with_the_spaces_prior_a_clear_gain_is_decided_at_the_first_look_on_a_noisy_machine():
    g = greedy(IDS)
    first = [Instance(10.0, None, 8.0, g), Instance(10.9, None, 8.0, g)]
    aa = Instance(9.4, 9.6, 8.0, g)
    plain = baseline_of(first, GateSettings(), aa=aa)
    primed = baseline_of(first, GateSettings(noise_prior=gate.Noise(0.06, 6)), aa=aa)
    assert primed.measured_noise == plain.noise and primed.noise.df == plain.noise.df + 6
    measured = []

    def more_defaults():
        measured.append(9.6)
        return 9.6

    # 1.45x on one fresh instance against the A/A's held-out figure: with 2 df of its own the bound
    # cannot clear 1 at level 0.99 (t = 6.96); with the prior's 6 more it does, on that one look.
    without = sequential_test(13.9, plain, GateSettings(), lambda: 13.9, more_defaults)
    assert measured and len(without.candidate) > 1
    measured.clear()
    with_prior = sequential_test(13.9, primed, GateSettings(noise_prior=gate.Noise(0.06, 6)), lambda: 13.9,
                                 more_defaults)
    assert with_prior.accepted and with_prior.candidate == [13.9] and measured == []
    # The call for more instances of the defaults reads the machine's own noise, not the prior.
    assert not gate.more_defaults_wanted(primed, judge_aa(aa, baseline_of(first, GateSettings()), GateSettings()), 0,
                                         GateSettings(noisy=0.10))
    assert gate.more_defaults_wanted(primed, judge_aa(aa, baseline_of(first, GateSettings()), GateSettings()), 0,
                                     GateSettings(noisy=0.05))


def test_a_gain_near_the_noise_takes_more_looks_than_one_far_above_it():
    """looks_needed: the fresh held-out instances (against as many of the defaults) until a true gain's
    lower bound clears 1 + min_gain. Measured on this machine kind (2026-12-06): core binding 1.13x at
    ±5.8% instance noise; one look was all a 30-minute run planned for."""
    from agent.gate import GateSettings, looks_needed
    from agent.stats import Noise, compare

    settings = GateSettings()
    noise = Noise(0.058, 6)
    near, far = looks_needed(1.13, noise, settings), looks_needed(1.6, noise, settings)
    assert far == 1 and near > 2
    # At that many looks the bound clears 1 for the true gain; one look fewer, it does not.
    def low(n: int) -> float:
        return compare([1.13] * n, [1.0] * n, noise, settings.level).low
    assert low(near) > 1.0 >= low(near - 1)
    assert looks_needed(1.0, noise, settings) is None and looks_needed(1.13, Noise(0.058, 0), settings) is None
    assert looks_needed(1.02, noise, settings) is None   # beyond max_instances


# ---- The latency guard: faster at the same load, but not by holding requests longer ----------

def latency_base(itl=(20.0, 21.0, 22.0), ttft=(130.0, 125.0, 135.0), tps=(10.0, 10.3, 9.8),
                 tpot=(19.0, 20.0, 21.0), e2e=(2600.0, 2500.0, 2700.0)):
    """The defaults with their search instances' p99 latencies (ms), as the ledger's rows give them."""
    g = greedy(IDS)
    return baseline_of([Instance(t, t * 0.97, 8.0, g, f, i, p, e)
                        for t, f, i, p, e in zip(tps, ttft, itl, tpot, e2e, strict=False)], GateSettings())


def test_speculation_with_four_times_the_chunk_gaps_but_every_request_sooner_passes_the_guard():
    base = latency_base()
    # Each chunk brings several tokens: the chunk-gap p99 is 4x the defaults', while every request's
    # pace (TPOT) and end-to-end time are lower. A reader gets every token sooner: not refused.
    speculating = result(12.0, greedy(IDS), ttft=130.0, itl=84.0, tpot=15.0, e2e=2000.0)
    verdict = check(speculating, base, lossless=True)
    assert verdict.passed and verdict.reasons == []
    assert verdict.search_ratio == pytest.approx(1.2, rel=0.02)


def test_a_faster_candidate_that_slows_each_requests_pace_or_its_first_token_is_refused_on_latency():
    base = latency_base()
    slow_pace = result(12.0, greedy(IDS), ttft=130.0, itl=21.0, tpot=42.0, e2e=2600.0)   # 1.2x tokens/s, 2x TPOT
    verdict = check(slow_pace, base, lossless=True)
    bound = gate.latency_bound(base.tpot_p99, GateSettings())
    assert not verdict.passed and not verdict.quality_ok
    assert verdict.reasons == [f"latency: p99 time per output token 42 ms is above the defaults' 20 ms beyond their "
                               f"noise (bound {bound:.0f} ms; set --slo-tpot-p99-ms to allow it)"]
    # Infeasible for Optuna, scaled by how far the bound was exceeded, as an SLO breach is.
    assert gate.constraint(verdict, slow_pace, GateSettings()) == pytest.approx(42.0 / bound - 1, abs=1e-3)
    late = check(result(12.0, greedy(IDS), ttft=1254.0, itl=21.0, tpot=20.0, e2e=2600.0), base, lossless=True)
    assert not late.quality_ok and late.reasons[0].startswith("latency: p99 time to first token 1254 ms")
    assert late.reasons[0].endswith("; set --slo-ttft-p99-ms to allow it)")
    held = check(result(12.0, greedy(IDS), ttft=130.0, itl=21.0, tpot=20.0, e2e=5400.0), base, lossless=True)
    assert not held.quality_ok and held.reasons[0].startswith("latency: p99 end-to-end latency 5400 ms")


def test_chunk_gaps_are_judged_only_by_the_users_itl_slo():
    base = latency_base()
    speculating = result(12.0, greedy(IDS), ttft=130.0, itl=84.0, tpot=15.0, e2e=2000.0)
    assert check(speculating, base, lossless=True, settings=GateSettings(slo_itl_p99_ms=100.0)).passed
    tight = GateSettings(slo_itl_p99_ms=50.0)      # above the user's own SLO: refused by it
    assert check(speculating, base, lossless=True, settings=tight).reasons == [
        "SLO: p99 inter-token latency 84 ms is above the bound 50 ms"]
    # A TTFT SLO replaces the guard for first tokens only: a request's pace stays guarded.
    other = GateSettings(slo_ttft_p99_ms=2000.0)
    slow_pace = result(12.0, greedy(IDS), ttft=1254.0, itl=21.0, tpot=42.0, e2e=2600.0)
    assert [r.split(" ms")[0] for r in check(slow_pace, base, lossless=True, settings=other).reasons] == [
        "latency: p99 time per output token 42"]


def test_a_users_tpot_slo_replaces_the_guards_tpot_bound_and_the_refusal_names_it():
    """N-gram speculation on the CPU engine slows the requests whose drafts fail (edit traffic: p99 TPOT
    97-103 ms against the defaults' 73, throughput 1.5-2x: docs/results.md): the guard refuses it and
    says which option allows it; a user who sets a TPOT bound has it judged by that bound alone."""
    base = latency_base()
    uneven = result(20.0, greedy(IDS), ttft=130.0, itl=60.0, tpot=30.0, e2e=2000.0)   # 2x tokens/s, 1.5x TPOT
    refused = check(uneven, base, lossless=True)
    assert not refused.passed and refused.reasons[0].startswith("latency: p99 time per output token 30 ms")
    assert refused.reasons[0].endswith("; set --slo-tpot-p99-ms to allow it)")
    assert check(uneven, base, lossless=True, settings=GateSettings(slo_tpot_p99_ms=40.0)).passed
    assert check(uneven, base, lossless=True, settings=GateSettings(slo_tpot_p99_ms=25.0)).reasons == [
        "SLO: p99 time per output token 30 ms is above the bound 25 ms"]


def test_a_p99_within_the_defaults_spread_passes():
    base = latency_base()
    # 23 ms against instances of 20, 21, 22 ms; 137 ms TTFT against 125-135 ms.
    assert check(result(12.0, greedy(IDS), ttft=137.0, itl=23.0, tpot=21.5, e2e=2750.0), base, lossless=True).passed


def test_the_latency_tolerance_widens_with_the_defaults_spread():
    settings = GateSettings()
    steady, spread = (20.0, 21.0, 22.0), (15.0, 21.0, 29.0)
    noise = pooled_noise([list(spread)])
    expected = gate.geomean(spread) * math.exp(t_quantile(settings.level, 2) * noise.sd * math.sqrt(1 + 1 / 3))
    assert gate.latency_bound(spread, settings) == pytest.approx(expected)
    assert gate.latency_bound(spread, settings) > 2 * gate.latency_bound(steady, settings)
    # 45 ms: refused against steady defaults, within the noise of ones that spread from 15 to 29 ms.
    assert not check(result(12.0, greedy(IDS), ttft=130.0, tpot=45.0), latency_base(tpot=steady), lossless=True).passed
    assert check(result(12.0, greedy(IDS), ttft=130.0, tpot=45.0), latency_base(tpot=spread), lossless=True).passed


def test_the_floor_applies_with_one_defaults_instance_and_to_defaults_that_agree():
    settings = GateSettings()
    assert gate.latency_bound((21.0,), settings) == pytest.approx(21.0 * (1 + settings.latency_tolerance))
    assert gate.latency_bound((20.0, 20.0, 20.0), settings) == pytest.approx(22.0)
    one = latency_base(tpot=(21.0,), ttft=(130.0,), tps=(10.0,), e2e=(2600.0,))
    assert check(result(12.0, greedy(IDS), ttft=130.0, tpot=23.0), one, lossless=True).passed
    assert not check(result(12.0, greedy(IDS), ttft=130.0, tpot=23.5), one, lossless=True).quality_ok
    wider = GateSettings(latency_tolerance=0.2)
    assert check(result(12.0, greedy(IDS), ttft=130.0, tpot=23.5), one, lossless=True, settings=wider).passed


def test_the_guard_is_off_where_the_objective_already_weighs_latency_or_nothing_was_measured():
    base = latency_base()
    goodput = result(12.0, greedy(IDS), ttft=1300.0, tpot=84.0)
    goodput.bench.objective, goodput.bench.figure = "goodput", 12.0   # on the defaults' scale
    assert check(goodput, base, lossless=True).passed
    # No latencies on the defaults' rows (an older ledger): nothing to compare with.
    assert check(result(12.0, greedy(IDS), ttft=1300.0, tpot=84.0, e2e=9000.0), steady_base(), lossless=True).passed


def test_a_baseline_rebuilt_from_the_ledger_on_resume_carries_the_defaults_latencies(tmp_path):
    from agent.defaults import baseline_from
    from agent.ledger import Ledger, Run, Trial
    from agent.recording import record

    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add(Run(id="r", deadline_at="2100-01-01T00:00:00+00:00", model="m", space_path="s", space_hash="h",
                   workload="smoke", repo="", settings={}))
    for source, tps, itl in (("baseline", 10.0, 20.0), ("baseline", 10.3, 21.0), ("aa", 9.8, 22.0)):
        row = ledger.add_trial(Trial(run_id="r", source=source, params={}))
        record(ledger, row, result(tps, greedy(IDS), ttft=130.0, itl=itl, tpot=itl, e2e=100 * itl))   # as the loop does
    resumed = Ledger(tmp_path / "ledger.sqlite")   # what a resume reads: the rows, nothing kept in memory
    base = baseline_from(resumed.trials("r"), GateSettings())
    assert sorted(base.itl_p99) == [20.0, 21.0, 22.0] and base.ttft_p99 == (130.0, 130.0, 130.0)
    assert sorted(base.tpot_p99) == [20.0, 21.0, 22.0] and sorted(base.e2e_p99) == [2000.0, 2100.0, 2200.0]
    verdict = check(result(12.0, greedy(IDS), ttft=130.0, itl=21.0, tpot=84.0, e2e=2100.0), base, lossless=True)
    assert verdict.reasons[0].startswith("latency: p99 time per output token 84 ms is above the defaults' 21 ms")


@pytest.mark.parametrize("p, df, tabulated", [
    (0.975, 3, 3.182446), (0.99, 3, 4.540703), (0.999, 3, 10.214532), (0.999, 4, 7.173182), (0.975, 4, 2.776445),
    (0.99, 4, 3.746947), (0.975, 10, 2.228139), (0.99, 10, 2.763769), (0.999, 10, 4.143700), (0.95, 30, 1.697261),
    (0.99, 2, 6.964557), (0.975, 1, 12.706205), (0.999, 60, 3.231709), (0.025, 3, -3.182446)])
def test_t_quantiles_are_exact_at_every_level_the_gate_uses(p, df, tabulated):
    """0.975 (figure intervals), 0.99 (the gate's level), 0.999 (pruning): the series used before was 0.74%,
    1.9% and 8.6% low at 3 degrees of freedom."""
    assert t_quantile(p, df) == pytest.approx(tabulated, rel=2e-6)
