"""The committed results of issue 36's device calls (train_accept_phase.py: trainrun, accept), from the results
file that came back:

    python3 benchmarks/gpu/issue36_summary.py RAW.json --device-minutes M [--date YYYY-MM-DD] [--name NAME]
        [--notes JSON]

writes benchmarks/gpu/results/NAME.json (default <gpu>-<date>-issue36, the gpu read from the device's name:
h100, h200) and prints a markdown summary. tests/run/test_train_accept_results.py checks every such file with
`checks()`: the training finished; the trainer killed with a checkpoint written resumed at or after it; stopped
and resumed at or after the last checkpoint before the stop; the trained draft's first-position acceptance
above the untrained one's by more than the verdict's margin (MARGIN when the verdict gives none).

The accept's JSON is read defensively (`inv accept` was written beside this): its drafts under "drafts" (or
"result"/"acceptance" holding them), each draft's per-position rates under "per_position" (or
"acceptance_per_position", "per_position_acceptance"); the whole JSON is kept in the raw file.
"""
import argparse
import datetime
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
#: The least first-position difference (trained minus untrained, absolute) that counts when the verdict
#: names no margin of its own.
MARGIN = 0.05
DRAFT_KEYS = ("per_position", "mean_acceptance_length", "drafts", "draft_tokens", "accepted_tokens", "prompts",
              "generated_tokens", "path")


def step_of(point):
    return point.get("global_step") if isinstance(point, dict) else None


def gpu_name(device):
    text = ((device or {}).get("gpu") or "").upper()
    return next((name.lower() for name in ("H100", "H200", "B200", "A100") if name in text), "gpu")


def drafts_of(found):
    """{"trained": {...}, "untrained": {...}} wherever the accept's JSON holds them."""
    if not isinstance(found, dict):
        return {}
    for holder in (found, found.get("result"), found.get("acceptance"), (found.get("exit") or {}).get("result")):
        if isinstance(holder, dict) and isinstance(holder.get("drafts"), dict):
            return holder["drafts"]
    return {}


def draft_figures(draft):
    draft = draft or {}
    rates = next((draft[key] for key in ("per_position", "acceptance_per_position", "per_position_acceptance",
                                         "position_acceptance") if isinstance(draft.get(key), list)), [])
    figures = {key: draft.get(key) for key in DRAFT_KEYS}
    figures["per_position"] = rates
    figures["position0"] = rates[0] if rates else None
    return figures


def two_proportion_z(p1, n1, p2, n2):
    """(p1 - p2) over its standard error when both are proportions of n1, n2 trials; None without counts."""
    if None in (p1, p2) or not n1 or not n2:
        return None
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    spread = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2)) if 0 < pooled < 1 else 0
    return round((p1 - p2) / spread, 2) if spread else None


def acceptance(raw):
    entry = raw.get("accept") or {}
    found = entry.get("json") or {}
    if not drafts_of(found) and entry.get("run"):
        found = entry["run"]
    drafts = drafts_of(found)
    trained, untrained = draft_figures(drafts.get("trained")), draft_figures(drafts.get("untrained"))
    verdict = found.get("verdict") if isinstance(found, dict) else None
    margin = (verdict or {}).get("margin")
    margin = margin if isinstance(margin, (int, float)) else MARGIN
    p_trained, p_untrained = trained["position0"], untrained["position0"]
    difference = round(p_trained - p_untrained, 4) if None not in (p_trained, p_untrained) else None
    return {
        "ran": bool(drafts), "argv": entry.get("argv"), "exit": entry.get("exit"), "seconds": entry.get("seconds"),
        "draft": entry.get("draft"), "prompts_file": entry.get("prompts"), "first_row": entry.get("first_row"),
        "num_prompts": entry.get("num_prompts"), "max_tokens": entry.get("max_tokens"),
        "trained": trained, "untrained": untrained, "verdict": verdict,
        "position0": {"trained": p_trained, "untrained": p_untrained, "difference": difference, "margin": margin,
                      "z": two_proportion_z(p_trained, trained.get("drafts"), p_untrained, untrained.get("drafts"))},
        "shifted_control": entry.get("shifted_control"), "error": entry.get("error"),
        "stderr_tail": entry.get("stderr_tail"),
    }


def training(raw):
    entry = raw.get("trainrun") or {}
    launch, kill, stop, resume = (entry.get(key) or {} for key in ("launch", "kill", "stop", "resume"))
    restart, final, timeline = kill.get("restart") or {}, entry.get("final") or {}, entry.get("timeline") or []
    return {
        "ran": bool(launch.get("run_id")), "run_id": launch.get("run_id"), "argv": launch.get("argv"),
        "plan": ((launch.get("json") or {}).get("train") or {}),
        "settings": {key: entry.get(key) for key in ("n_train", "epochs", "checkpoint_minutes", "total_seq_len",
                                                     "more_steps")},
        "extraction": {key: (entry.get("extraction") or {}).get(key) for key in ("rows", "state", "seconds",
                                                                                "wait_s", "run_id")},
        "verify": {key: (entry.get("verify") or {}).get(key) for key in ("exit", "trainable", "counts", "seconds")},
        "kill": {"done": kill.get("done"), "pid": kill.get("pid"), "process": (kill.get("process") or {}).get("cmd"),
                 "global_step_at_kill": (kill.get("before") or {}).get("global_step"),
                 "checkpoint_before": (kill.get("before") or {}).get("last_checkpoint"),
                 "resumed_from": restart.get("resumed_from"),
                 "global_step_seen_after_restart": restart.get("global_step"),
                 "seconds_to_restarted_steps": restart.get("seconds_after_kill"),
                 "killed_attempt": restart.get("killed_attempt"), "why_not": kill.get("why")},
        "stop": {"done": stop.get("done"), "exit": stop.get("exit"), "seconds": stop.get("seconds"),
                 "global_step_at_stop": (stop.get("before") or {}).get("global_step"),
                 "checkpoint_before": (stop.get("before") or {}).get("last_checkpoint"),
                 "checkpoint_after": (stop.get("after") or {}).get("last_checkpoint"),
                 "state_after": (stop.get("after") or {}).get("state")},
        "resume": {"exit": resume.get("exit"), "seconds": resume.get("seconds"),
                   "resumed_from": (resume.get("after") or {}).get("resumed_from")},
        "logged_resumes": entry.get("logged_resumes"), "attempts": entry.get("attempts"),
        "state": final.get("state"), "finished": entry.get("finished"), "global_step_final": final.get("global_step"),
        "stopped_for_accept": entry.get("stopped_for_accept"), "losses": entry.get("losses"),
        "status_loss_first_last": [next((row[4] for row in timeline if row[4] is not None), None),
                                   next((row[4] for row in reversed(timeline) if row[4] is not None), None)],
        "draft": entry.get("draft"), "passed": entry.get("passed"), "cut": entry.get("cut"),
        "timeline": entry.get("timeline"),
    }


def checks(summary):
    """Each claim of issue 36 point 4 against the summary's numbers: {name: bool}."""
    train, accept = summary["training"], summary["acceptance"]
    before_kill, after_kill = step_of(train["kill"]["checkpoint_before"]), step_of(train["kill"]["resumed_from"])
    before_stop, after_resume = step_of(train["stop"]["checkpoint_before"]), step_of(train["resume"]["resumed_from"])
    position0 = accept["position0"]
    return {
        "finished": train["state"] == "succeeded" and bool(train["finished"]),
        "killed_after_a_checkpoint": bool(train["kill"]["done"]) and before_kill is not None,
        "restart_resumed_at_or_after_the_checkpoint": None not in (before_kill, after_kill)
        and after_kill >= before_kill,
        "resume_after_stop_at_or_after_its_checkpoint": bool(train["stop"]["done"]) and train["resume"]["exit"] == 0
        and None not in (before_stop, after_resume) and after_resume >= before_stop,
        "trained_above_untrained_beyond_the_margin": position0["difference"] is not None
        and position0["difference"] > position0["margin"] and (accept["verdict"] or {}).get("better") is not False,
    }


def build(raw, *, device_minutes, date, notes=()):
    summary = {"issue": 36, "date": date, "commit": raw.get("commit"), "device": raw.get("device"),
               "device_minutes_used": device_minutes, "model": raw.get("model"),
               "calls": raw.get("phases_started"), "wall_by_call": raw.get("wall_by_call"),
               "errors": raw.get("errors") or [], "skipped": raw.get("skipped") or [],
               "training": training(raw), "acceptance": acceptance(raw), "notes": list(notes)}
    summary["not_run"] = [{"what": "a draft trained on token-shifted states (the control)",
                           "why": summary["acceptance"]["shifted_control"] or "not in these calls"}]
    summary["checks"] = checks(summary)
    summary["passed"] = all(summary["checks"].values())
    return summary


def markdown(summary):
    train, accept = summary["training"], summary["acceptance"]
    trained, untrained = accept["trained"], accept["untrained"]

    def rates(draft):
        return ", ".join("%.3f" % rate for rate in draft["per_position"]) or "-"

    lines = ["| step | global step | checkpoint (global step) |", "|---|---|---|",
             "| kill -9 of the trainer | %s | before: %s |" % (train["kill"]["global_step_at_kill"],
                                                              step_of(train["kill"]["checkpoint_before"])),
             "| the supervisor's restart resumed from | %s | |" % step_of(train["kill"]["resumed_from"]),
             "| inv stop | %s | before: %s, after: %s |" % (train["stop"]["global_step_at_stop"],
                                                          step_of(train["stop"]["checkpoint_before"]),
                                                          step_of(train["stop"]["checkpoint_after"])),
             "| inv resume resumed from | %s | |" % step_of(train["resume"]["resumed_from"]),
             "| the end (%s) | %s | |" % (train["state"], train["global_step_final"]), "",
             "| draft | position 0 | per position | mean acceptance length | drafts | prompts | generated tokens |",
             "|---|---|---|---|---|---|---|"]
    for name, draft in (("trained", trained), ("untrained", untrained)):
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (name, draft["position0"], rates(draft),
                                                              draft["mean_acceptance_length"], draft["drafts"],
                                                              draft["prompts"], draft["generated_tokens"]))
    lines += ["", "checks: " + ", ".join("%s %s" % (name, "PASS" if ok else "FAIL")
                                         for name, ok in summary["checks"].items())]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("raw")
    parser.add_argument("--device-minutes", type=float, required=True)
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--name", help="the results' file name (default <gpu>-<date>-issue36)")
    parser.add_argument("--notes", default="[]", help="JSON list of strings")
    args = parser.parse_args()
    with open(args.raw) as handle:
        raw = json.load(handle)
    summary = build(raw, device_minutes=args.device_minutes, date=args.date, notes=json.loads(args.notes))
    name = args.name or "%s-%s-issue36" % (gpu_name(raw.get("device")), args.date)
    path = os.path.join(HERE, "results", name + ".json")
    with open(path, "w") as handle:
        json.dump(summary, handle, indent=1)
        handle.write("\n")
    print(markdown(summary))
    print("wrote %s; passed %s" % (path, summary["passed"]), file=sys.stderr)


if __name__ == "__main__":
    main()
