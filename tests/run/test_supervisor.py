"""The supervisor's mechanics on real processes, through the `local` host (remote/entry.py in a
subprocess, as `--host local` runs it): the stall watchdog, a prompt that would wait forever,
the retry policy, stop. The job is tests/programs/job_tree.py, which keeps running but stops making
progress, or fails the same way in every attempt, with or without writing samples first."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from base import contract, procs
from base.contract import DISK_LOW, FAILED, LOST, OUTPUT_UNWRITABLE, RUNNING, STALLED, STOPPED, TIME_LIMIT_TOO_SHORT
from base.units import human_bytes
from run import attempt, disk_watch
from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.transport import connect
from support.paths import PROGRAMS

JOB_TREE = PROGRAMS / "job_tree.py"
#: The free-space margin's floor, as the runs' messages write it.
FLOOR = human_bytes(disk_watch.FLOOR_BYTES)
FAST = {"stall_timeout_s": 2, "load_timeout_s": 2, "backoff_s": 0.2, "grace_s": 1, "telemetry_interval_s": 1}
#: What transformers prints before it waits for an answer about custom code.
TRUST_PROMPT = ("The repository for /models/kimi contains custom code which must be executed to correctly load the "
                "model.\nDo you wish to run the custom code? [y/N] ")


@pytest.fixture
def local(tmp_path):
    host = Host(name="local", python=sys.executable, workdir=str(tmp_path / "work"))
    with connect(host) as remote:
        yield host, remote


def launch(local, tmp_path, job: dict, **options) -> str:
    host, remote = local
    result = remote.call("runs.launch", {"workdir": host.workdir, "host": "local",
                                  "driver_program": str(JOB_TREE),
                                  "driver_args": {"output_dir": str(tmp_path / "out"), "children": 1, **job},
                                  "options": {**FAST, **options}})
    return result["run_id"]


def wait_state(local, run_id, states, timeout=120):
    host, remote = local
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = remote.call("runs.status", {"workdir": host.workdir, "run": run_id})["runs"][0]
        if run["state"] in states:
            return run
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} never reached {states}: {run['state']}")


def test_a_stalled_run_is_restarted_when_configured_until_its_restarts_are_spent(local, tmp_path):
    run_id = launch(local, tmp_path, {"stall_after": 1}, stall_restart=True, max_restarts=1)
    run = wait_state(local, run_id, (FAILED,))
    assert [a["failure"]["kind"] for a in run["attempts"]] == ["stalled", "stalled"]
    assert run["restarts"] == 1
    assert all(a["left_behind"] is None for a in run["attempts"])


def test_a_hung_driver_is_stalled_at_its_samples_pace_not_at_the_stall_timeout(local, tmp_path):
    """A sample a second, then none (alive, its heartbeat rewritten: a hung collective): the stall is called at
    the bound the samples' pace gives (attempt.Pace), long before stall_timeout_s. Meanwhile status says how
    long since the last sample instead of a rate."""
    host, remote = local
    run_id = launch(local, tmp_path, {"write_samples": True, "stall_after": 6}, stall_timeout_s=600,
                    load_timeout_s=600, max_restarts=0)
    run = wait_state(local, run_id, (RUNNING,))
    while not (run.get("pace") or {}).get("stale") or not run["pace"]["last_sample_at"]:
        run = remote.call("runs.status", {"workdir": host.workdir, "run": run_id})["runs"][0]
        time.sleep(0.5)
    assert run["state"] == RUNNING and run["pace"]["since_sample_s"] >= contract.PACE_STALE_S, run["pace"]
    run = wait_state(local, run_id, (FAILED,), timeout=300)
    failure = run["last_failure"]
    assert failure["kind"] == "stalled" and "median gap between samples" in failure["explain"], failure
    assert run["attempts"][0]["left_behind"] is None
    assert run["pace"] is None  # a run that ended has no pace to show


def test_a_stopped_driver_is_stalled_in_seconds_and_named(local, tmp_path):
    """SIGSTOP of the driver (Ctrl-Z, a debugger): its stopped state is a stall after attempt.STOPPED_S, in any
    phase and whatever the bound, and the failure names the process; nothing is left behind."""
    run_id = launch(local, tmp_path, {}, stall_timeout_s=600, load_timeout_s=600, max_restarts=0)
    run = wait_state(local, run_id, (RUNNING,))
    driver = run["driver_pid"]
    os.kill(driver, signal.SIGSTOP)
    try:
        run = wait_state(local, run_id, (FAILED,), timeout=120)
    finally:
        if procs.alive(driver):
            os.kill(driver, signal.SIGCONT)
    failure = run["last_failure"]
    assert failure["kind"] == "stalled" and "job_tree.py (pid %d) stopped for" % driver in failure["explain"], failure
    assert run["attempts"][0]["left_behind"] is None and not procs.alive(driver)


def test_a_driver_hung_without_using_the_cpu_is_stalled_at_the_idle_bound_not_at_the_timeouts(local, tmp_path):
    """Alive, not stopped, its heartbeat rewritten, and idle (a frozen cgroup, a deadlock): with both timeouts at
    ten minutes, the stall is called once the job's processes used almost no CPU for attempt.IDLE_S."""
    run_id = launch(local, tmp_path, {"stall_after": 0}, stall_timeout_s=600, load_timeout_s=600, max_restarts=0)
    run = wait_state(local, run_id, (FAILED,), timeout=300)
    failure = run["last_failure"]
    assert failure["kind"] == "stalled" and "of CPU in %.0f s, with no progress" % attempt.IDLE_S in failure["explain"]
    assert "frozen cgroup" in failure["advice"], failure
    assert run["attempts"][0]["left_behind"] is None


def test_idle_is_the_cpu_the_attempts_processes_used_in_the_window_whatever_came_and_went():
    """attempt.CpuUse sums each process's own CPU time over the looks: a process new since the last look counts
    all it used, one gone counts nothing more, so a worker replaced mid-window neither hides nor fakes use."""
    use, idle_s = attempt.CpuUse(), attempt.IDLE_S
    use.look(0.0, [{"pid": 1, "cpu_s": 50.0}])
    use.look(idle_s / 2, [{"pid": 1, "cpu_s": 50.1}])
    assert use.idle(idle_s / 2, quiet=idle_s / 2) is None  # not quiet for long enough yet
    use.look(idle_s + 1, [{"pid": 1, "cpu_s": 50.2}])
    assert use.idle(idle_s + 1, quiet=idle_s + 1) == pytest.approx(0.2)
    assert use.idle(idle_s + 1, quiet=idle_s / 2) is None  # progress came within the window
    use.look(idle_s + 2, [{"pid": 2, "cpu_s": 3.0}])  # pid 1 gone, pid 2 new with 3 s of its own
    assert use.idle(idle_s + 2, quiet=idle_s + 2) is None
    use.look(3 * idle_s, [{"pid": 2, "cpu_s": 3.0}])
    assert use.idle(3 * idle_s, quiet=3 * idle_s) == pytest.approx(0.0)
    use.look(3 * idle_s + 1, [])
    assert use.idle(3 * idle_s + 1, quiet=3 * idle_s) is None  # no process left to hang: its exit decides


def test_a_stalled_run_is_only_marked_when_restarts_are_not_configured(local, tmp_path):
    host, remote = local
    run_id = launch(local, tmp_path, {"stall_after": 1}, stall_restart=False)
    run = wait_state(local, run_id, (STALLED,))
    assert run["stalled"] and len(run["attempts"]) == 1 and run["driver_pid"]
    stopped = remote.call("runs.stop", {"workdir": host.workdir, "run": run_id}, timeout=120)
    assert stopped["clean"] and stopped["state"] == STOPPED


def test_a_process_waiting_on_a_trust_remote_code_prompt_is_ended_and_not_restarted(local, tmp_path):
    run_id = launch(local, tmp_path, {"stall_after": 1, "say_on_stall": TRUST_PROMPT}, stall_restart=False)
    run = wait_state(local, run_id, (FAILED,))
    assert len(run["attempts"]) == 1
    failure = run["last_failure"]
    assert failure["kind"] == "trust-remote-code" and not failure["retryable"]
    assert "no progress for" in failure["explain"] and "apply-patches" in failure["advice"]


def test_a_failure_repeated_without_a_new_sample_is_not_restarted_a_third_time(local, tmp_path):
    """An unknown, retryable failure; the same twice (only the pid in its message differs) and no
    sample written: the second attempt ends the run, though restarts are left."""
    host, _ = local
    run_id = launch(local, tmp_path, {"fail_after": 0, "fail_with": "basic_ios::clear: iostream error",
                                      "write_samples": True}, max_restarts=3)
    run = wait_state(local, run_id, (FAILED,))
    first, second = run["attempts"]
    assert first["failure"]["kind"] == second["failure"]["kind"] == "unknown"
    assert first["failure"]["retryable"] is True and second["failure"]["retryable"] is False
    assert first["failure"]["evidence"] != second["failure"]["evidence"]  # other pids
    assert first["failure"]["signature"] == second["failure"]["signature"]
    assert first["samples_written"] == second["samples_written"] == 0
    assert second["failure"]["repeats_attempt"] == 1 and run["restarts"] == 1
    assert "the same failure as attempt 1, with no new sample since" in run["last_failure"]["explain"]
    assert "a restart would fail the same way" in run["last_failure"]["advice"]
    log = (Path(host.workdir) / "runs" / run_id / "driver.log").read_text()
    assert "attempt 1: unknown (the driver failed with exit status 1); restarting" in log
    assert "attempt 2: unknown (" in log and "; the same failure twice with no new sample: not restarting" in log


def test_a_failure_after_new_samples_is_restarted_until_the_restarts_are_spent(local, tmp_path):
    run_id = launch(local, tmp_path, {"fail_after": 1, "fail_with": "basic_ios::clear: iostream error",
                                      "write_samples": True}, max_restarts=2)
    run = wait_state(local, run_id, (FAILED,))
    assert [a["samples_written"] for a in run["attempts"]] == [1, 1, 1]
    assert [a["failure"]["kind"] for a in run["attempts"]] == ["unknown"] * 3
    assert len({a["failure"]["signature"] for a in run["attempts"]}) == 1
    assert run["restarts"] == 2 and "repeats_attempt" not in run["last_failure"]
    assert sorted(os.listdir(tmp_path / "out")) == ["data_0.pt", "data_1.pt", "data_2.pt"]


def supervisor_warned_of_its_time_limit(local, run_id: str) -> dict:
    """USR1 to the run's supervisor, as its Slurm job's shell hands on the warning before the time limit
    (slurm/jobs.py supervised()): the run once it ended."""
    host, remote = local
    run = remote.call("runs.status", {"workdir": host.workdir, "run": run_id})["runs"][0]
    os.kill(run["supervisor_pid"], signal.SIGUSR1)
    return wait_state(local, run_id, (STOPPED, FAILED))


def test_a_time_limit_after_new_samples_stops_the_run_for_its_job_to_be_requeued(local, tmp_path):
    run_id = launch(local, tmp_path, {"samples": 600, "write_samples": True})
    wait_state(local, run_id, (RUNNING,))
    wait_for_file = time.monotonic() + 60
    while not (tmp_path / "out" / "data_0.pt").exists() and time.monotonic() < wait_for_file:
        time.sleep(0.2)
    run = supervisor_warned_of_its_time_limit(local, run_id)
    assert run["state"] == STOPPED and run["attempts"][-1]["samples_written"] >= 1, run
    assert run["last_failure"] is None


def test_a_time_limit_before_any_sample_fails_the_run_naming_a_longer_slurm_time(local, tmp_path):
    host, _ = local
    run_id = launch(local, tmp_path, {"samples": 600})  # counts samples, writes none: a model still loading
    wait_state(local, run_id, (RUNNING,))
    run = supervisor_warned_of_its_time_limit(local, run_id)
    assert run["state"] == FAILED and run["attempts"][-1]["samples_written"] == 0, run
    failure = run["last_failure"]
    assert failure["kind"] == TIME_LIMIT_TOO_SHORT and not failure["retryable"]
    assert "before any sample was written" in failure["explain"] and "slurm.time" in failure["advice"]
    log = (Path(host.workdir) / "runs" / run_id / "driver.log").read_text()
    assert "attempt 1: stopped (SIGUSR1)" in log and "; not requeued" in log


def test_a_lost_run_whose_driver_outlived_its_supervisor_is_resumed_with_one_driver(local, tmp_path):
    host, remote = local
    run_id = launch(local, tmp_path, {})
    run = wait_state(local, run_id, (RUNNING,))
    while not (run.get("heartbeat") or {}).get("samples_done"):
        run = wait_state(local, run_id, (RUNNING,))
    os.kill(run["supervisor_pid"], signal.SIGKILL)  # the supervisor dies (OOM killer, a bug); its driver goes on
    assert wait_state(local, run_id, (LOST,))["driver_pid"] == run["driver_pid"]
    resumed = remote.call("runs.resume", {"workdir": host.workdir, "run": run_id})
    assert resumed["resumed_from"] == LOST
    assert procs.members(run["driver_pgid"]) == []  # the old driver and its child were ended first
    again = wait_state(local, run_id, (RUNNING,))
    assert again["driver_pid"] != run["driver_pid"] and len(again["attempts"]) == 2
    assert again["attempts"][0]["lost"] and again["attempts"][0]["ended_at"]
    assert remote.call("runs.stop", {"workdir": host.workdir, "run": run_id}, timeout=120)["clean"]


def test_a_stopped_supervisor_is_unresponsive_at_once_and_stop_then_resume_finish_the_run(local, tmp_path):
    """SIGSTOP of the supervisor: alive, answering nothing. Status says so at once (no waiting for a stall),
    resume refuses in one line naming the fix, stop ends it and its driver (nothing left), and the resume after
    that finishes every sample."""
    host, remote = local
    run_id = launch(local, tmp_path, {"write_samples": True, "samples": 3, "children": 0})
    run = wait_state(local, run_id, (RUNNING,))
    supervisor = run["supervisor_pid"]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        run = wait_state(local, run_id, (contract.UNRESPONSIVE,), timeout=10)
        assert run["supervisor_unanswering"] == "stopped"
        with pytest.raises(Exception, match="unresponsive: its supervisor .* is stopped; `inv stop"):
            remote.call("runs.resume", {"workdir": host.workdir, "run": run_id})
        stopped = remote.call("runs.stop", {"workdir": host.workdir, "run": run_id}, timeout=120)
    finally:
        if procs.alive(supervisor):
            os.kill(supervisor, signal.SIGCONT)
    assert stopped["clean"] and stopped["state"] == STOPPED and not procs.alive(supervisor), stopped
    remote.call("runs.resume", {"workdir": host.workdir, "run": run_id})
    run = wait_state(local, run_id, (contract.SUCCEEDED,))
    assert sorted(path.name for path in (tmp_path / "out").glob("data_*.pt")) == ["data_0.pt", "data_1.pt",
                                                                                  "data_2.pt"]


def test_a_driver_that_cannot_be_started_fails_the_run_with_the_reason(local, tmp_path):
    run_id = launch(local, tmp_path, {})
    host, remote = local
    wait_state(local, run_id, (RUNNING,))
    remote.call("runs.stop", {"workdir": host.workdir, "run": run_id}, timeout=120)
    # The program is gone when the run is resumed (a venv removed, a path mistyped).
    record_path = Path(host.workdir) / "runs" / run_id / "run.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps(dict(record, driver_program=str(tmp_path / "gone.py"))))
    remote.call("runs.resume", {"workdir": host.workdir, "run": run_id})
    run = wait_state(local, run_id, (FAILED,))
    assert run["last_failure"]["kind"] == "driver-not-started" and not run["last_failure"]["retryable"]


def test_stop_ends_a_child_that_left_the_session_and_one_that_ignores_sigterm(local, tmp_path):
    host, remote = local
    run_id = launch(local, tmp_path, {"children": 2, "ignore_term": True, "own_session": True})
    run = wait_state(local, run_id, (RUNNING,))
    children_file = Path(host.workdir) / "runs" / run_id / "heartbeat.json.children"
    deadline = time.monotonic() + 60
    while not children_file.exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    children = json.loads(children_file.read_text())
    # Once the supervisor has seen the children, it follows the one that leaves the session.
    while not {str(pid) for pid in children} <= set(wait_state(local, run_id, (RUNNING,)).get("job_seen", {})):
        assert time.monotonic() < deadline
    stopped = remote.call("runs.stop", {"workdir": host.workdir, "run": run_id}, timeout=120)
    assert stopped["clean"] and set(stopped["pids"]) >= {run["driver_pid"], *children}
    assert not any(procs.alive(pid) for pid in children)


def test_an_output_that_cannot_be_written_fails_the_run_before_its_first_attempt_in_one_line(local, tmp_path):
    host, remote = local
    (tmp_path / "a-file").write_text("not a directory")
    out = tmp_path / "a-file" / "out"
    with pytest.raises(UsageError) as refused:
        launch(local, tmp_path, {"output_dir": str(out)})
    line = refused.value.one_line()
    assert "\n" not in line and f"cannot write {str(out)!r}: " in line and "Not a directory" in line, line
    # The run's record says it too, and it is over: no "starting" left behind.
    run = remote.call("runs.status", {"workdir": host.workdir})["runs"][-1]
    assert run["state"] == FAILED and run["attempts"] == [], run
    assert run["last_failure"]["kind"] == OUTPUT_UNWRITABLE and not run["last_failure"]["retryable"]
    assert run["exit"]["failure"] == run["last_failure"]


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs with room for the floor of the free-space margin and 4 MiB more; remount(extra) makes room."""
    mount = tmp_path / "small-disk"
    mount.mkdir()

    def size(extra_mib: int) -> str:
        return f"size={disk_watch.FLOOR_BYTES // 2**20 + extra_mib}m"

    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", size(4), "tmpfs", str(mount)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    yield mount, lambda extra_mib: subprocess.run(["mount", "-o", f"remount,{size(extra_mib)}", str(mount)],
                                                  check=True)
    subprocess.run(["umount", str(mount)], check=True)


def test_a_run_low_on_disk_stops_keeping_its_samples_and_resumes_only_once_there_is_room(local, tmp_path,
                                                                                        small_disk):
    host, remote = local
    mount, make_room = small_disk
    out = mount / "out"
    sample = 2**20  # 12 in flight (batch_size 8 + writes_in_flight 4): less than the floor
    run_id = launch(local, tmp_path, {"output_dir": str(out), "write_samples": True, "sample_bytes": sample,
                                      "samples": 1000})
    run = wait_state(local, run_id, (FAILED,))
    failure = run["last_failure"]
    assert failure["kind"] == DISK_LOW and not failure["retryable"] and len(run["attempts"]) == 1, failure
    assert failure["explain"].startswith("disk low: ") and f" free on {out}, need about {FLOOR}" in \
        failure["explain"], failure
    assert "--out" in failure["advice"] and failure["free_bytes"] < failure["need_bytes"], failure
    # Stopped before the disk filled: every sample there is whole.
    written = sorted(out.glob("data_*.pt"))
    assert written and all(path.stat().st_size == sample for path in written), written
    assert disk_watch.free_bytes(str(out)) > 0

    with pytest.raises(UsageError) as refused:
        remote.call("runs.resume", {"workdir": host.workdir, "run": run_id})
    assert "disk low: " in refused.value.one_line() and f" free on {out}, need about {FLOOR}" in \
        refused.value.one_line(), refused.value.one_line()

    make_room(64)
    remote.call("runs.resume", {"workdir": host.workdir, "run": run_id})
    wait_state(local, run_id, (RUNNING,))
    assert remote.call("runs.stop", {"workdir": host.workdir, "run": run_id}, timeout=120)["clean"]
