"""The committed results of the GPU run, from what device_run.py brought back.

    python3 benchmarks/gpu/summarize.py RAW.json --device-minutes M [--date YYYY-MM-DD] [--name NAME]
        [--issue N] [--not-run JSON] [--notes JSON] [--extras DIR]

writes benchmarks/gpu/results/NAME.json (default h200-<date>) (every field tests/run/test_gpu_results.py checks)
and NAME.md (the tables), and prints the markdown. Issue 26's figures per arm (steady tokens/s, tokens/s
after the load from the server's health to the last file, the server's start, the health to the first
file) and its goals, each PASS or MISS: specrig steady / bare steady >= 0.90, specrig steady / by-hand steady
>= 1.25, specrig after the load / bare after the load >= 0.80 (goals()). What the call did not run is said
in not_run: given on the command line, else from the phases it had and those it skipped for its budget.
"""
import argparse
import datetime
import json
import os
import sys

import fault_phase

HERE = os.path.dirname(os.path.abspath(__file__))
ARM_ORDER = ("hand", "specrig", "bare")


def iso_seconds(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def states(raw):
    found = raw.get("states") or {}
    if "documented" not in found:
        return {"ran": False, "error": found.get("error"), "arm": found.get("arm")}
    documented, shifted = found["documented"], found["shifted"]
    return {
        "ran": True, "files": found["files"], "tokens": found["tokens"], "dtype": found["dtype"],
        "layer_ids": found["layer_ids"], "num_hidden_layers": found["num_hidden_layers"],
        "reference": found["reference"], "gpu": found.get("gpu"),
        "pairing": "id k = output of decoder layer k-1 (the input of layer k); 0 = embeddings; L = last "
                   "layer's output before the final norm",
        "tolerance": found["tolerance"],
        "calibration_fp32": found.get("calibration_fp32"),  # the run that set the tolerance from bf16's own error
        "per_layer": {k: {"max_abs_diff": v["max_abs_diff"], "max_abs_ref": v["max_abs_ref"],
                          "rel_l2": v["rel_l2"], "worst_sample_rel_l2": v["worst_sample_rel_l2"]}
                      for k, v in documented.items()},
        "max_abs_diff": max(v["max_abs_diff"] for v in documented.values()),
        "worst_rel_l2": max(v["worst_sample_rel_l2"] for v in documented.values()),
        "within_tolerance": found["within_tolerance"],
        "shifted_control": {
            "pairing": "id k against the output of decoder layer k (k = L: of layer L-2)",
            "per_layer": {k: {"max_abs_diff": v["max_abs_diff"], "rel_l2": v["rel_l2"]} for k, v in shifted.items()},
            "min_rel_l2": min(v["rel_l2"] for v in shifted.values()),
            "fails": found["shifted_fails"]},
        "problems": found["problems"], "files_with_nonfinite": found["files_with_nonfinite"],
        "by_prefix": found.get("by_prefix"),  # worst sample per layer, shared system prompt or not (later runs)
        "seconds": {"load": found["load_s"], "check": found["check_s"]},
        # issue 26 on: the measured arm whose files these are, and which of them (a subset, spread over them)
        "arm": found.get("arm"), "subset": found.get("subset"), "client_patch": found.get("client_patch"),
    }


def kill9(raw):
    extract = raw.get("extract") or {}
    kill = extract.get("kill") or {}
    attempts = extract.get("attempts") or []
    failures = [a.get("failure") for a in attempts if a.get("failure")]
    first = failures[0] if failures else {}
    restart = iso_seconds(extract.get("restart_started_at"))
    back = extract.get("memory_back_to_idle_at")
    final = extract.get("exit") or {}
    result = final.get("result") or {}
    return {
        "ran": bool(kill.get("at_epoch")),
        "skipped": kill.get("skipped"),
        "killed": {"engine_core_pids": kill.get("pids"), "samples_done_before": kill.get("samples_done_before"),
                   "memory_used_before_mib": kill.get("memory_before_mib")},
        "reaction": kill.get("reaction"),  # the supervisor's markers and states, seconds from the kill (fault_phase)
        "attempts": [{"attempt": a.get("attempt"), "started_at": a.get("started_at"), "ended_at": a.get("ended_at"),
                      "failure": {k: (a.get("failure") or {}).get(k) for k in
                                  ("kind", "rule", "role", "retryable", "restarted", "explain", "evidence")}
                      if a.get("failure") else None,
                      "gpu_memory": a.get("gpu_memory"), "orphans_ended": a.get("orphans_ended")}
                     for a in attempts],
        "classified": first.get("kind"), "restarted": bool(first.get("restarted")) and len(attempts) > 1,
        "idle_memory_used_mib": (extract.get("idle_memory_used_mib") or [None])[0],
        "memory_back_to_idle_s_after_kill": round(back - kill["at_epoch"], 2) if back and kill.get("at_epoch") else None,
        "restart_s_after_kill": round(restart - kill["at_epoch"], 2) if restart and kill.get("at_epoch") else None,
        "memory_idle_before_restart": bool(back and restart and back <= restart),
        "files_before_kill": extract.get("files_before_kill"),
        "files_before_kill_kept": extract.get("files_before_kill_kept"),
        "final_state": extract.get("state"), "final_files": extract.get("files"),
        "samples_requested": extract.get("samples"), "final_result": result,
        "complete": extract.get("state") == "succeeded" and extract.get("files") == extract.get("samples"),
    }


def stop(raw):
    found = raw.get("stop") or {}
    result = (found.get("stop") or {}).get("json") or {}
    return {"ran": "seconds" in found, "clean": found.get("clean"), "seconds": found.get("seconds"),
            "samples_done_at_stop": found.get("samples_done_at_stop"),
            "idle_memory_used_mib": (found.get("idle_memory_used_mib") or [None])[0],
            "memory_used_before_mib": (found.get("memory_before_mib") or [None])[0],
            "memory_used_right_after_mib": (found.get("memory_right_after_mib") or [None])[0],
            "memory_used_2s_after_mib": (found.get("memory_2s_after_mib") or [None])[0],
            "left": result.get("left"), "gpu_memory": result.get("gpu_memory"),
            "engine_cores_left": found.get("engine_cores_left"), "state": found.get("state")}


def way_of(label, arm):
    """specrig, hand or bare: the arm's own record (issue 26 on) or its name's first word (runs 1-4)."""
    return arm.get("way_id") or label.split("-")[0]


def table(raw):
    rows = []
    for label, arm in (raw.get("arms") or {}).items():
        client = arm.get("client_patch") or {}
        rows.append({"arm": label, "way": arm.get("way"), "way_id": way_of(label, arm),
                     "shape": arm.get("shape") or "llama8b",
                     "settings": arm.get("settings") or {}, "concurrency": arm.get("concurrency"),
                     "settings_nondefault": arm.get("settings_nondefault"),
                     "client_patch": client.get("state") if client.get("used", True) and client else None,
                     "samples": arm.get("samples"), "tokens": arm.get("tokens"), "wall_s": arm.get("wall_s"),
                     "server_ready_s": arm.get("server_ready_s"), "after_load_s": arm.get("after_load_s"),
                     "first_sample_s": arm.get("first_sample_s"), "last_sample_s": arm.get("last_sample_s"),
                     "health_to_first_file_s": arm.get("health_to_first_file_s"),
                     "health_to_last_file_s": arm.get("health_to_last_file_s"),
                     "tokens_per_s_to_last_file": arm.get("tokens_per_s_to_last_file"),
                     "tokens_per_s": arm.get("tokens_per_s"), "samples_per_s": arm.get("samples_per_s"),
                     "tokens_per_s_after_load": arm.get("tokens_per_s_after_load"),
                     "generate_s": arm.get("generate_s"), "tokens_per_s_generate": arm.get("tokens_per_s_generate"),
                     "steady_s": None, "steady_tokens_per_s": None, "steady_from": None,
                     "prefix_caching": arm.get("prefix_caching"), "prompts": arm.get("prompts"),
                     "prepare_after_health_s": arm.get("prepare_after_health_s"), "startup_s": arm.get("startup_s"),
                     "state": arm.get("state"), "error": arm.get("error")})
        # The steady part: the rate once the client is up, without its start-up. Issue 26 on, every way alike
        # from the first file (the first answer, bare) to the last; runs 1-4 had no last-file time: from the
        # first file to the end of the client step.
        end = (arm.get("phases_s") or {}).get("validating") or arm.get("client_done_s")
        if arm.get("last_sample_s") and arm.get("first_sample_s") and arm.get("tokens") \
                and arm["last_sample_s"] > arm["first_sample_s"]:
            steady = round(arm["last_sample_s"] - arm["first_sample_s"], 2)
            rows[-1].update(steady_s=steady, steady_tokens_per_s=round(arm["tokens"] / steady, 1),
                            steady_from="first to last file")
        elif (arm.get("way") or "").startswith("bare") and arm.get("generate_s") and arm.get("first_sample_s"):
            # the bare client times itself from after its imports: its wall less its first answer
            steady = round(arm["generate_s"] - (arm["first_sample_s"] - arm["server_ready_s"]), 2)
            rows[-1].update(steady_s=steady, steady_tokens_per_s=round(arm["tokens"] / steady, 1),
                            steady_from="first answer to the client's end")
        elif end and arm.get("first_sample_s") and arm.get("tokens"):
            steady = round(end - arm["first_sample_s"], 2)
            rows[-1].update(steady_s=steady, steady_tokens_per_s=round(arm["tokens"] / steady, 1),
                            steady_from="first file to the client step's end")
    return rows


#: Issue 26's goals (point 4): specrig with its defaults after apply-patches against bare prefill and by
#: hand, in the same run. (name, specrig's figure, the other way, its figure, goal, what the figure is)
GOALS = (
    ("specrig_steady_vs_bare", "steady_tokens_per_s", "bare", "steady_tokens_per_s", 0.90,
     "steady tokens/s, specrig / bare prefill"),
    ("specrig_steady_vs_hand", "steady_tokens_per_s", "hand", "steady_tokens_per_s", 1.25,
     "steady tokens/s, specrig / by hand"),
    ("specrig_after_load_vs_bare", "tokens_per_s_to_last_file", "bare", "tokens_per_s_to_last_file", 0.80,
     "tokens/s after the load (server health to the last file), specrig / bare prefill"),
)


def goal_arms(rows, shape="llama8b", figure="steady_tokens_per_s"):
    """The arms issue 26's goals compare, at one shape: specrig with its defaults (no setting other than
    specrig's defaults) and speculators' client patched; by hand with the client as shipped; bare prefill.
    Of several of one kind, the fastest by `figure`; None where there is none. Only arms that sent the
    same prompts are compared: those of the prompt set with the most arms, else (no digests) all."""
    rows = prompt_set(rows, shape)

    def measured(way, keep=lambda row: True):
        found = [row for row in rows if row["shape"] == shape and row["way_id"] == way and not row.get("error")
                 and row.get(figure) and keep(row)]
        return max(found, key=lambda row: row[figure], default=None)
    return {"specrig": measured("specrig", lambda row: row.get("client_patch") == "patched"
                                and not row.get("settings_nondefault")),
            "hand": measured("hand", lambda row: row.get("client_patch") in ("unpatched", None)),
            "bare": measured("bare")}


def prompt_set(rows, shape="llama8b"):
    """The arms of one shape that sent the same prompts (the digest of their token ids), the set with the most
    ways measured, then the most arms: a call that measured 512 samples and another 768 compares each
    within its own set. Rows without a digest (runs before issue 26) are one set."""
    at = [row for row in rows if row["shape"] == shape]
    sets = {}
    for row in at:
        sets.setdefault((row.get("prompts") or {}).get("sha256"), []).append(row)
    return max(sets.values(), key=lambda found: (len({row["way_id"] for row in found}), len(found)), default=[])


def goals(rows, shape="llama8b"):
    """Each goal of issue 26 at one shape: the value, the goal, PASS or MISS (NOT MEASURED where an arm or a
    figure is missing), and the two arms, each goal's specrig arm the best of its defaults by that figure."""
    out = {}
    for name, ours, way, theirs, goal, what in GOALS:
        chosen = goal_arms(rows, shape, ours)
        mine, other = chosen["specrig"], chosen[way]
        value = round(mine[ours] / other[theirs], 4) if mine and other and mine.get(ours) and other.get(theirs) \
            else None
        out[name] = {"what": what, "goal": goal, "value": value,
                     "verdict": "NOT MEASURED" if value is None else "PASS" if value >= goal else "MISS",
                     "arms": [(mine or {}).get("arm"), (other or {}).get("arm")]}
    return out


def checks(rows, shape="llama8b"):
    """What makes the arms comparable: the same prompts (the digest of the token ids each sent), and the
    bare arm's server with the extraction server's prefix-caching setting (as their logs say it ran)."""
    at = [row for row in rows if row["shape"] == shape and not row.get("error")]
    digests = {row["arm"]: (row.get("prompts") or {}).get("sha256") for row in at if row.get("prompts")}
    logged = {row["arm"]: (row.get("prefix_caching") or {}).get("server_log") for row in at
              if row.get("prefix_caching")}
    ways = {row["arm"]: row["way_id"] for row in at}
    extraction = {value for arm, value in logged.items() if ways[arm] != "bare"}
    bare = {value for arm, value in logged.items() if ways[arm] == "bare"}
    return {"same_prompts": (len(set(digests.values())) == 1 and None not in digests.values()) if digests else None,
            "prompts_sha256": digests,
            # goals() compares within one of them (prompt_set): several sets are said, not mixed
            "goal_arms_prompts_sha256": (prompt_set(rows, shape)[0].get("prompts") or {}).get("sha256")
            if prompt_set(rows, shape) else None,
            "prefix_caching_logged": logged,
            "prefix_caching_same": (len(extraction | bare) == 1 and None not in extraction | bare)
            if extraction and bare else None}


def ratios(rows, shape="llama8b"):
    """The ratios at one model shape, each way's best arm."""
    by = {}
    for row in rows:
        if row["shape"] == shape:
            by.setdefault(row["arm"].split("-")[0], []).append(row)
    measured = lambda rows: [r for r in rows if r.get("tokens_per_s_after_load")]
    best = lambda name: max(measured(by.get(name, [])), key=lambda r: r["tokens_per_s_after_load"], default=None)
    hand, ours, bare = best("hand"), best("specrig"), best("bare")
    # The overhead is like for like: specrig with its defaults (no settings) at the by-hand arm's concurrency,
    # since a setting by hand's flow lacks (a tmpfs staging, more writer threads) is not specrig's overhead.
    plain = [r for r in measured(by.get("specrig", [])) if not r["settings"] and hand
             and r["concurrency"] == hand["concurrency"]]
    out = {}
    if hand and plain:
        like = max(plain, key=lambda r: r["tokens_per_s_after_load"])
        out["specrig_overhead_vs_hand_after_load"] = round(like["after_load_s"] / hand["after_load_s"] - 1, 4)
        out["overhead_arms"] = [like["arm"], hand["arm"]]
    for key in ("tokens_per_s_generate", "steady_tokens_per_s"):
        for name, row in (("specrig", ours), ("hand", hand)):
            if bare and row and bare.get(key) and row.get(key):
                out["%s_vs_bare_prefill_%s" % (name, key)] = round(row[key] / bare[key], 4)
    if bare and ours and bare.get("tokens_per_s_after_load"):
        out["extraction_vs_bare_prefill_tokens_per_s"] = round(
            ours["tokens_per_s_after_load"] / bare["tokens_per_s_after_load"], 4)
    if bare and hand and bare.get("tokens_per_s_after_load"):
        out["hand_vs_bare_prefill_tokens_per_s"] = round(
            hand["tokens_per_s_after_load"] / bare["tokens_per_s_after_load"], 4)
    out["best"] = {k: (v or {}).get("arm") for k, v in (("hand", hand), ("specrig", ours), ("bare", bare))}
    return out


#: The standard library's top-level names (py-spy shows a frame's file from its import root).
STDLIB = set(sys.stdlib_module_names) | {"<frozen"}


def frame_package(frame):
    """`name (openai/_utils/_transform.py:393)` -> "openai"; "typing" for `(typing.py:1574)`; the code
    torch.compile generates -> "torch-compiled"."""
    path = frame.rpartition(" (")[2]
    if path.startswith("<frozen"):
        return "<frozen"
    name = path.split("/")[0].split(".py")[0]
    # torch.compile's generated modules: hashed names, or code compiled from a string
    return "torch-compiled" if path.startswith("<string>") or len(name) >= 40 else name


def main_thread_packages(path, top=6):
    """A py-spy raw (collapsed) file's main thread: the share of its samples in each package, a sample
    counted for the innermost frame outside the standard library (a stack all in the standard library, the
    event loop's wait or a thread's join, counts as "stdlib")."""
    counts, total = {}, 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            frames = stack.split(";")
            if not stack or "MainThread" not in frames[0]:
                continue
            total += int(n)
            packages = [frame_package(frame) for frame in frames[1:]]
            owner = next((p for p in reversed(packages) if p not in STDLIB), "stdlib")
            counts[owner] = counts.get(owner, 0) + int(n)
    shares = sorted(((name, round(n / total, 3)) for name, n in counts.items()), key=lambda item: -item[1])
    return {"samples": total, "packages": [list(item) for item in shares[:top]]}


def profiles(raw, extras):
    """Each profiled arm's window: GPU utilization, each process's busiest threads, and (from the py-spy
    files under `extras`, where given) what each process's main thread was on."""
    found = {}
    for label, arm in (raw.get("arms") or {}).items():
        window = arm.get("profile")
        if not window:
            continue
        entry = {"window_s": window.get("window_s"), "error": window.get("error"),
                 "gpu_utilization_mean": (window.get("gpu_utilization") or {}).get("mean"),
                 "cpu_cores_by_process": {role: threads[-1][2] for role, threads in
                                          (window.get("cpu_by_thread") or {}).items()},
                 "busiest_threads": {role: [[tid, share] for tid, _, share in threads[:-1][:4]]
                                     for role, threads in (window.get("cpu_by_thread") or {}).items()}}
        if window.get("from_s") is not None and arm.get("first_sample_s") and arm.get("last_sample_s"):
            # issue 26 on: the window's seconds in the arm, and whether they lay between its first and last file
            entry.update(from_s=window["from_s"], to_s=window["to_s"], in_steady_part=bool(
                arm["first_sample_s"] <= window["from_s"] and window["to_s"] <= arm["last_sample_s"]))
        for role in (window.get("cpu_by_thread") or {}):
            # the profile's directory keeps the name the arm had when it began (arm["files_label"] if renamed)
            path = os.path.join(extras or "", "profile-%s" % arm.get("files_label", label), "py-spy-%s.txt" % role)
            if extras and os.path.exists(path):
                entry.setdefault("main_thread", {})[role] = main_thread_packages(path)
        found[label] = entry
    return found


#: Issue 26's figures of each arm, in the .md: (key, heading)
FIGURES = (("arm", "arm"), ("concurrency", "conc."), ("client_patch", "speculators' client"),
           ("samples", "samples"), ("tokens", "tokens"), ("server_ready_s", "server start s"),
           ("health_to_first_file_s", "health to first file s"), ("health_to_last_file_s", "health to last file s"),
           ("steady_s", "steady s"), ("steady_tokens_per_s", "tokens/s (steady)"),
           ("tokens_per_s_to_last_file", "tokens/s (after the load)"), ("prefix_caching", "prefix caching"))


def cell(row, key):
    value = row.get(key)
    if key == "prefix_caching" and isinstance(value, dict):
        logged = {True: "on", False: "off"}.get(value.get("server_log"), "?")
        return "%s (%s; log: %s)" % (value.get("setting") or "?", value.get("from") or "?", logged)
    return "-" if value is None else str(value)


def markdown(summary):
    keys = ("arm", "concurrency", "samples", "tokens", "wall_s", "server_ready_s", "after_load_s", "first_sample_s",
            "generate_s", "steady_s", "tokens_per_s", "tokens_per_s_after_load", "tokens_per_s_generate",
            "steady_tokens_per_s", "samples_per_s")
    lines = []
    found = summary.get("goals") or {}
    if any(row.get("health_to_last_file_s") is not None for row in summary["table"]):
        lines += ["| " + " | ".join(heading for _, heading in FIGURES) + " |", "|" + "---|" * len(FIGURES)]
        lines += ["| " + " | ".join(cell(row, key) for key, _ in FIGURES) + " |" for row in summary["table"]]
        lines += ["", "\"after the load\": from the server's /health to the last file (bare: the last answer); "
                  "\"steady\": from the first file to the last; the server's start is reported, not in a ratio.",
                  ""]
    by_shape = summary.get("goals_by_shape") or ({summary.get("main_shape", "llama8b"): {
        "goals": found, "checks": summary.get("checks")}} if found else {})
    for shape, entry in by_shape.items():
        if shape != summary.get("main_shape") and all(g["value"] is None for g in entry["goals"].values()):
            continue  # another shape's arms without the goals' arms: nothing to say
        lines += ["Goals (issue 26, %s):" % shape, ""]
        lines += ["- %s: **%s** (goal >= %s): **%s** (%s against %s)" % (
            goal["what"], "-" if goal["value"] is None else goal["value"], goal["goal"], goal["verdict"],
            goal["arms"][0] or "no arm", goal["arms"][1] or "no arm") for goal in entry["goals"].values()]
        checked = entry.get("checks") or {}
        lines += ["- the same prompts in every arm (digest of the token ids sent): %s" % checked.get("same_prompts"),
                  "- bare prefill's server with the extraction server's prefix caching (their logs): %s"
                  % checked.get("prefix_caching_same"), ""]
    lines += ["| arm | conc. | samples | tokens | wall s | server up s | after load s | first sample s | client step s "
              "| steady s | tokens/s (wall) | tokens/s (after load) | tokens/s (client step) | tokens/s (steady) "
              "| samples/s (wall) |", "|" + "---|" * len(keys)]
    for row in summary["table"]:
        lines.append("| " + " | ".join("-" if row.get(k) is None else str(row.get(k)) for k in keys) + " |")
    lines.append("")
    for shape, found in summary["ratios_by_shape"].items():
        lines += ["", "%s:" % shape, ""] + ["- %s: %s" % item for item in found.items()]
    for label, window in (summary.get("profiles") or {}).items():
        lines += ["", "profile of %s (%s s of its steady part%s): GPU busy %s %%; CPU cores: %s" % (
            label, window["window_s"], "" if window.get("in_steady_part") is not False else ", NOT within it",
            window["gpu_utilization_mean"],
            ", ".join("%s %s" % item for item in window["cpu_cores_by_process"].items()))]
        for role, main in (window.get("main_thread") or {}).items():
            lines.append("- %s main thread, by package: %s" % (role, ", ".join(
                "%s %d %%" % (name, round(share * 100)) for name, share in main["packages"])))
    lines += fault_phase.summary_lines(summary["issue35"])
    if summary.get("skipped"):
        lines += ["", "skipped for the call's budget: " + ", ".join(
            "%s (%s s left, needs %s)" % (entry["phase"], entry["left_s"], entry["needs_s"])
            for entry in summary["skipped"])]
    return "\n".join(lines) + "\n"


def not_run_defaults(raw, summary, given):
    """What this call did not run, said where the command line did not: the phases skipped for the budget,
    and the checks of issue 19 (kill -9, stop, the states, the smoke) it had no phase for."""
    said = " ".join(entry["what"] for entry in given)
    phases = list(dict.fromkeys(name for name, _ in raw.get("phases_started") or []))
    out = [{"what": "phase %s" % entry["phase"],
            "why": "skipped: %s s of the call's budget left, it takes at least %s s" % (entry["left_s"], entry["needs_s"])}
           for entry in raw.get("skipped") or [] if entry["phase"] not in said]
    for ran, what, phase in ((summary["kill9"]["ran"], "kill -9 of the EngineCore", "extract"),
                             (summary["stop"]["ran"], "stop mid-run", "stop"),
                             (summary["states"]["ran"], "the states against transformers", "states"),
                             (bool(summary["table"]), "measurement", "arm:")):
        word = what.split()[0] if what != "the states against transformers" else "states"
        if not ran and word not in said:
            why = ("not among this call's phases (%s)" % " ".join(phases)) if not any(
                p.startswith(phase) for p in phases) else "its phase ran and did not finish: see errors"
            out.append({"what": what, "why": why})
    return out


def build(raw, *, device_minutes, date, issue=26, not_run=(), notes=(), extras=None, bf16_drift=None):
    """The committed summary of a raw results.json (everything tests/run/test_gpu_results.py checks)."""
    rows = table(raw)
    extract = raw.get("extract") or {}
    launch = (extract.get("launch") or {}).get("json") or {}
    doctor = (raw.get("doctor") or {}).get("json") or {}
    states_block = states(raw)
    if bf16_drift and states_block.get("ran"):
        drift = bf16_drift["bf16_sdpa_vs_bf16_eager"]
        measured = {k: drift[k] for k in states_block["per_layer"] if k in drift}
        states_block["bf16_drift_reference"] = {
            "how": "benchmarks/gpu/bf16_drift.py %s: transformers against itself (sdpa vs eager attention, both "
                   "bf16), the same 8B-wide shape, random weights and tokens, on the CPU; relative L2 per layer "
                   "id" % ("%d %d nofp32" % (bf16_drift["layers"], bf16_drift["tokens"])),
            "rel_l2": measured,
            "within_bf16_drift": {k: states_block["per_layer"][k]["worst_sample_rel_l2"] <= v
                                  for k, v in measured.items()},
            "not_measured": [k for k in states_block["per_layer"] if k not in drift]}
    summary = {
        "issue": issue, "date": date, "commit": raw.get("commit"), "device": raw.get("device"),
        "device_minutes_used": device_minutes, "model": raw.get("model"),
        "doctor": {"exit": (raw.get("doctor") or {}).get("exit"), "result": doctor},
        "preflight": launch.get("preflight"),
        "extract": {k: extract.get(k) for k in ("run_id", "samples", "state", "files", "tokens", "wall_s",
                                                "layer_ids", "layer_convention", "server_argv")},
        "states": states_block, "kill9": kill9(raw), "stop": stop(raw),
        "table": rows, "ratios": ratios(rows),
        "ratios_by_shape": {shape: ratios(rows, shape) for shape in sorted({row["shape"] for row in rows})},
        "main_shape": "llama8b", "goals": goals(rows), "checks": checks(rows),
        # the same at every shape measured (a CPU rehearsal's tiny model; another shape's arms beside the 8B)
        "goals_by_shape": {shape: {"goals": goals(rows, shape), "checks": checks(rows, shape)}
                           for shape in sorted({row["shape"] for row in rows})},
        "smoke_deepseek_v3": raw.get("smoke_deepseek_v3"), "profiles": profiles(raw, extras),
        "issue35": fault_phase.summary(raw, rows),
        "nvidia_smi_fixtures": "tests/fixtures/nvidia-smi/h200-vllm",
        "phases": [name for name, _ in raw.get("phases_started") or []], "preset_env": raw.get("preset_env"),
        "skipped": raw.get("skipped", []),
        "errors": raw.get("errors", []), "notes": list(notes),
    }
    summary["not_run"] = list(not_run) + not_run_defaults(raw, summary, list(not_run))
    return summary


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("raw")
    parser.add_argument("--device-minutes", type=float, required=True)
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--issue", type=int, default=26, help="the issue the run was for (runs 1-4: 19)")
    parser.add_argument("--name", help="the results' file name (default h200-DATE); tests check the last by name")
    parser.add_argument("--not-run", default="[]", help="JSON list of {what, why}")
    parser.add_argument("--notes", default="[]", help="JSON list of strings")
    parser.add_argument("--extras", help="the unpacked extras.tgz's extras/: the profiles' py-spy files")
    parser.add_argument("--bf16-drift", help="bf16_drift.py's output: the yardstick beside the fixed tolerance")
    args = parser.parse_args()
    with open(args.raw) as f:
        raw = json.load(f)
    drift = None
    if args.bf16_drift:
        with open(args.bf16_drift) as f:
            drift = json.load(f)
    summary = build(raw, device_minutes=args.device_minutes, date=args.date, issue=args.issue,
                    not_run=json.loads(args.not_run), notes=json.loads(args.notes), extras=args.extras,
                    bf16_drift=drift)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    base = os.path.join(HERE, "results", args.name or "h200-%s" % args.date)
    with open(base + ".json", "w") as f:
        json.dump(summary, f, indent=1, default=str)
        f.write("\n")
    text = markdown(summary)
    with open(base + ".md", "w") as f:
        f.write("# GPU run %s at %s (issue %d)\n\n" % (args.date, (summary["commit"] or "?")[:12], args.issue) + text)
    print(text)


if __name__ == "__main__":
    main()
