"""The GPU runs of issues 19 and 26, on the device: specrig's own tasks (`inv ... --host local`) driving vLLM 0.26.0
and speculators 0.9.0 in server mode on a random-weight model, checked and measured.

    python3 benchmarks/gpu/device_run.py PHASE [PHASE ...]      (benchmarks/gpu/device.sh sets the env)

Phases (each adds to one results file, $SG/results.json, copied to $OUT after every step so that a call
cut short still brings back what it did):

    prep            nvidia-smi at idle; the model (SHAPE, default llama8b) and the chat data built here
    extract         inv doctor; inv extract (preflight, launch) over N_EXTRACT samples; kill -9 of the
                    EngineCore mid-run; the supervisor's classification, restart and resume; GPU memory
                    sampled throughout; every stored layer against transformers' forward
    stop            inv extract, then inv stop mid-run: clean, seconds, GPU memory after
    arm:WAY[:C[:K=V,...]]
                    one arm of the measurement over N_MEASURE samples (arms.py): specrig (inv extract,
                    concurrency C, empty or `default` for specrig's own, and its options K=V: writer_threads=16,
                    staging=ram, ...; out=DIR puts its --out under DIR; `ram` is a directory on the tmpfs $RAM),
                    hand (the server, prepare-data, generate-offline-data as speculators' docs say, after
                    inv revert-patches: speculators as shipped), bare (the same server without the speculative
                    config, the extraction server's prefix-caching setting, max_tokens=1: the ceiling).
                    Any arm takes `profile=1`: a window of its steady part profiled (profiling.py); a specrig
                    arm `patch=1` (inv apply-patches --host local before it) or `patch=0` (inv revert-patches).
                    Each arm is named by its way, concurrency, the settings that differ from specrig's defaults
                    and the state of speculators' client it ran (patched/unpatched, read from the file), and
                    prepares what it needs itself: the prompts come from a cache keyed by the data, the
                    tokenizer and prepare-data's arguments ($SG/prepared-cache), filled by the first arm that
                    prepares them
    fault:SIGNAL-PROCESS@SAMPLES[+...][:K=V,...]
                    issue 35: one run with faults injected mid-run (SIGSTOP or SIGKILL of the EngineCore or the
                    API server), the seconds to the supervisor's reaction, the recovery (fault_phase.py)
    states[:WHICH]  the states of the files the latest arm or fault cell named WHICH* (default specrig) kept
                    (STATES_FILES, spread over its files) against transformers' forward: the tolerance from
                    bf16's own error, the shifted control
    smoke           inv smoke on a DeepSeek-V3-shaped config (MLA, MoE), shrunk, dummy weights
    train[:DIR]     issue 28: inv verify-dataset --full of an output (DIR, or a short extraction of N_TRAIN rows),
                    then a few steps of the training command it printed (train_step.py)
    trainrun        issue 36: a short extraction of N_TRAIN rows, inv verify-dataset, inv train --detach; kill -9
                    of the trainer after a checkpoint, the supervisor's restart and the step it resumed from;
                    inv stop, inv resume, waited to the end (train_accept_phase.py; resumable across calls)
    accept          issue 36: inv accept of trainrun's draft against an untrained one on held-out prompts
    warm[:bare]     the extraction server (and with :bare the bare one) started to its /health and stopped:
                    the first start's costs paid in the last staging call, not in the measurement's

    issue26         a preset (arms.PRESETS): issue 26's measurement in one call within 600 s, N_MEASURE=512:
                    prep clean arm:specrig:default:patch=1,profile=1 states:specrig arm:bare:128 arm:hand:32
    issue35         issue 35's GPU cells (arms.PRESETS): a fault run, its states, the render server's first run
                    and bare prefill

A phase is not begun with less of BUDGET_S left than it takes at best (arms.PHASE_MIN_S): it is skipped, and
the results say so (`skipped`), rather than cut short at the call's end.

Environment: SG (default /var/tmp/sg: model, data, outputs), OUT (what comes back), SHAPE, N_EXTRACT
(256), N_MEASURE (768), N_DATA (1024), KILL_AT (samples done before the kill, 64), PORT (8000), RAM
(/dev/shm/sg), STATES_FILES (64), BUDGET_S (device.sh's), PATCHSET (apply-patches --patchset), N_FAULT (256)
and FAULT_WATCH_S (120: fault_phase.py).

This file dispatches; each phase is a module of its own (prep_phase.py: prep, clean; extract_phase.py: extract,
stop, smoke; arm_phase.py over arm_runs.py and arm_inputs.py: arm; states_phase.py; warm_phase.py;
fault_phase.py; train_step.py; kimi_phase.py; train_accept_phase.py: trainrun, accept), all standing on
harness.py (the settings, the results, the tools) and arms.py (the arms' plain data).
"""
import os
import signal
import sys
import time
import traceback

import arm_phase
import arms
import extract_phase
import fault_phase
import harness
import kimi_phase
import prep_phase
import states_phase
import train_accept_phase
import train_step
import warm_phase

#: The phases that take no spec, by name.
PLAIN_PHASES = {"prep": prep_phase.phase_prep, "clean": prep_phase.phase_clean, "extract": extract_phase.phase_extract,
                "stop": extract_phase.phase_stop, "smoke": extract_phase.phase_smoke}


def on_budget_end(signum, frame):
    """device.sh's `timeout` ends the harness at BUDGET_S: keep the logs of the arms still running (the sixth
    run's arm ran into it and brought nothing back), then exit as timeout does."""
    for name, run_path in list(harness.RUNNING.items()):
        harness.keep_run_files(name, run_path)
        harness.results.setdefault("errors", []).append({"phase": "arm:%s" % name, "error": "cut by the budget"})
    harness.save()
    os._exit(124)


def main(phases):
    """Run `phases` in order (a preset, arms.PRESETS, expands to its phases and sets its environment where
    the call does not); each one's failure is recorded and the next still runs; one that the budget left
    cannot hold is skipped, and said so in the results (skipped)."""
    phases, preset_env = arms.expand(phases, os.environ)
    for key, value in preset_env.items():
        os.environ[key] = value
        if key in ("N_MEASURE", "N_EXTRACT", "N_DATA", "KILL_AT", "STATES_FILES"):
            setattr(harness, key, int(value))
    harness.record("phases_started", harness.results.get("phases_started", [])
                   + [[p, time.strftime("%H:%M:%S")] for p in phases])
    if preset_env:
        harness.record("preset_env", dict(harness.results.get("preset_env") or {}, **preset_env))
    for index, phase in enumerate(phases):
        left, needs = harness.budget_left(), arms.phase_min_s(phase)
        if left is not None and needs and left < needs:
            harness.log("== %s skipped: %.0f s of the budget left, it takes at least %d s" % (phase, left, needs))
            harness.results.setdefault("skipped", []).append({"phase": phase, "left_s": round(left, 1),
                                                              "needs_s": needs})
            harness.save()
            continue
        harness.log("== %s" % phase)
        try:
            if phase.startswith("arm:"):
                later_states = any(p.startswith("states") for p in phases[index + 1:])
                arm_phase.phase_arm(phase, keep_for_states=harness.STATES_FILES if later_states else 0)
            elif phase.startswith("states"):
                states_phase.phase_states(phase)
            elif phase.startswith("warm"):
                warm_phase.phase_warm(phase)
            elif phase == "trainrun":  # before "train": issue 36's kill and resume of `inv train`
                train_accept_phase.phase_trainrun(phase, later=phases[index + 1:])
            elif phase == "accept":
                train_accept_phase.phase_accept(phase)
            elif phase.startswith("train"):
                train_step.phase_train(phase, harness=harness)
            elif phase.startswith("fault"):  # issue 35's fault cells
                fault_phase.run(harness, phase)
            elif phase.startswith("kimi"):  # issue 29's shrunk Kimi-K2.5
                kimi_phase.run(harness, phase)
            elif phase in PLAIN_PHASES:
                PLAIN_PHASES[phase]()
            else:
                raise ValueError("no phase %r (device_run.py's docstring lists them)" % phase)
        except Exception as exc:  # recorded, the next phase still runs
            traceback.print_exc()
            harness.results.setdefault("errors", []).append({"phase": phase, "error": repr(exc)})
            harness.save()
    harness.results.setdefault("wall_by_call", []).append(round(time.time() - harness.T0, 1))
    harness.save()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, on_budget_end)
    main(sys.argv[1:])
