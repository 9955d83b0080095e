"""An acceptance measurement's results read back, and its verdict (stdlib only).

Each draft's measurement (measure.py) is acceptance/<name>.json: vLLM's spec-decode counters over the run's
prompts. Position i's acceptance rate is the drafts whose token i was accepted over the drafts made; the mean
acceptance length is 1 + accepted tokens / drafts (the target's own token counts once per step).

The verdict compares the first position, where a draft trained on wrong states shows it first: the trained
draft is better when the 95% Wilson lower bound of its rate (over its drafts) lies above the untrained draft's
95% Wilson upper bound. Overlapping intervals are "not better": too few drafts to tell counts as not proven.
"""
import json
import math
import os

DRAFTS = ("trained", "untrained")
#: What the report shows of the run's plan (run.json["accept"]).
PLAN_KEYS = ("draft", "model", "prompts", "first_row", "num_prompts", "max_tokens", "k", "tp")
#: The two-sided 95% normal quantile: each bound is a 97.5% one-sided bound.
Z_95 = 1.959964


def wilson(successes, trials, z=Z_95):
    """(lower, upper) of the Wilson score interval of successes/trials; (0.0, 1.0) with no trials."""
    if trials <= 0:
        return 0.0, 1.0
    rate = successes / trials
    denominator = 1 + z * z / trials
    centre = (rate + z * z / (2 * trials)) / denominator
    spread = z * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, centre - spread), min(1.0, centre + spread)


def summary(measured):
    """What status and the report show of one draft's measurement (measure.py's record)."""
    drafts = measured["num_drafts"]
    per_position = measured["accepted_per_position"]
    first = per_position[0] if per_position else 0
    low, high = wilson(first, drafts)
    return {"path": measured["draft"], "drafts": drafts, "draft_tokens": measured["num_draft_tokens"],
            "accepted_tokens": measured["num_accepted_tokens"],
            "acceptance_per_position": [round(count / drafts, 4) if drafts else 0.0 for count in per_position],
            "accepted_per_position": per_position,
            "mean_acceptance_length": round(1 + measured["num_accepted_tokens"] / drafts, 4) if drafts else None,
            "position0": {"rate": round(first / drafts, 4) if drafts else None, "low": round(low, 4),
                          "high": round(high, 4)},
            "prompts": measured["prompts"], "generated_tokens": measured["generated_tokens"],
            "k": measured["k"], "vllm": measured.get("vllm")}


def judge(trained, untrained, *, compared):
    """The verdict: {"better": bool, "reason"}; `compared` False when no untrained draft was asked for."""
    if trained is None or (compared and untrained is None):
        return None
    if not compared:
        return {"better": False, "reason": "no untrained draft to compare with (--untrained none): not judged"}
    low, high = trained["position0"]["low"], untrained["position0"]["high"]
    if not trained["drafts"]:
        return {"better": False, "reason": "the trained draft made no drafts: nothing was measured"}
    if low > high:
        return {"better": True, "reason": "position 0: trained's 95%% lower bound %.3f > untrained's upper bound "
                                          "%.3f" % (low, high)}
    return {"better": False, "reason": "position 0: trained's 95%% lower bound %.3f <= untrained's upper bound "
                                       "%.3f: not clearly better" % (low, high)}


def report(plan):
    """status.json's `acceptance` for a run's plan (run.json["accept"]): each draft's summary as measured so far
    (None: not yet), the verdict once both are in, and what was measured (the plan's settings)."""
    drafts = {name: read(plan["results"], name) for name in DRAFTS}
    shown = {name: summary(found) if found else None for name, found in drafts.items()}
    compared = plan["untrained"]["source"] != "none"
    settings = dict({key: plan[key] for key in PLAN_KEYS}, untrained=plan["untrained"]["path"] or "none")
    return {"drafts": shown, "verdict": judge(shown["trained"], shown["untrained"], compared=compared),
            "plan": settings}


def read(results, name):
    """A draft's measurement, or None before it is written (each is written whole, by rename)."""
    try:
        with open(os.path.join(results, name + ".json")) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
