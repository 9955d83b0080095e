"""`inv extract` on the lab's Slurm login node, lab-slurm, as one Slurm job (docs/slurm.md, "extract: one run,
one job"), through the real CLI, sshd, sbatch, slurmctld and slurmd: in-process and in server mode, each
checked against transformers' own forward; `status` on a pending job, `stop` of it; a request that could
never run refused with nothing queued; a job requeued by its time limit and by the admin (preemption), and
one warned before any sample, failed and not requeued; a job array in-process and in server mode.

As few model loads as each case needs: the lab has two cores, shared. They skip when the Slurm lab or the runnable
environments are not built, and fail then under CI's SPECRIG_REQUIRE_LAB=1.
"""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from base import outputs, prepared
from base.contract import ACTIVE_STATES, FAILED, RESTARTING, RUNNING, STARTING, STOPPED, SUCCEEDED, TIME_LIMIT_TOO_SHORT
from slurm import formats, jobs
from specrig.lab import READY
from specrig.lab import slurm as lab_slurm
from specrig.run.sharded_runs import verify_output
from support.lab import inv, inv_json, lab_entry, phase, require_lab, wait_for
from support.patchenv import as_lab_user
from support.paths import REPO
from support.runnable_env import HOME, clean_venv_copy, private_inventory, runnable_env_or_skip
from support.server_lab import CLIENT, LAB_SERVER_ENV, run_files, states_against_transformers
from support.shared_envs import ensure_patched

HOST = "lab-slurm"
WORKDIR = HOME / "specrig-slurm"
MODEL, DATA = HOME / "models" / "tiny-llama", HOME / "data" / "tiny-chat.jsonl"
#: The tiny chat dataset: 96 conversations; server mode's rows, one per assistant turn.
CONVERSATIONS = 96
#: Server mode's rows in its tests here (of the dataset's 189): the server-mode fleet test's
#: (tests/fleet/test_fleet_server_lab.py); the job's path, not the rows' number, is under test.
ROWS = 24
#: In-process states against transformers' (tests/run/test_extraction_driver.py's bound).
TOLERANCE = 2e-2
RUN_TIMEOUT_S = 900


#: The in-process environment of this module's lab-slurm: {"python": its interpreter}, set by `cluster`.
PRIVATE: dict[str, str] = {}


@pytest.fixture(scope="module")
def cluster(lab, tmp_path_factory):
    """The lab's Slurm, its login node lab-slurm running a private copy of ~/venv-cpu, patched here: the tests
    in the other CI process patch and revert the shared one while these run (issue 27). Every `inv` of this
    module without an inventory of its own reads this one (SPECRIG_HOSTS)."""
    require_lab(lab_slurm.slurm_is_up(), "lab Slurm not built: run `inv lab.up --runnable --slurm` as root")
    require_lab(READY.read_text() == "runnable\n", "lab-slurm needs the runnable environments: inv lab.up --runnable")
    prefix = clean_venv_copy(HOME / "venv-cpu")
    PRIVATE["python"] = str(prefix / "bin" / "python")
    inventory = private_inventory(tmp_path_factory.mktemp("lab-slurm"), HOST, python=PRIVATE["python"])
    before = os.environ.get("SPECRIG_HOSTS")
    os.environ["SPECRIG_HOSTS"] = str(inventory)
    try:
        applied = inv("apply-patches", "--host", HOST, timeout=600)
        assert applied.returncode == 0, applied.stdout[-3000:] + applied.stderr[-3000:]
        yield lab
    finally:
        if before is None:
            os.environ.pop("SPECRIG_HOSTS", None)
        else:
            os.environ["SPECRIG_HOSTS"] = before
        as_lab_user("rm", "-rf", str(prefix))


@pytest.fixture
def out():
    """A fresh output directory on the shared home for one test, removed after it."""
    path = WORKDIR / "test-out" / uuid.uuid4().hex[:12]
    yield path
    code, status = inv_json("status", "--host", HOST)
    for run in status["runs"]:
        if (run["out"] or "").startswith(str(path)) and run["state"] in ACTIVE_STATES:
            inv("stop", "--host", HOST, "--run", run["run_id"], timeout=300)  # a test that failed midway
    as_lab_user("rm", "-rf", str(path))


def queue() -> dict[str, str]:
    """{job id: name} of every job in the queue (the login node is this machine)."""
    listed = subprocess.run(["squeue", "-h", "-o", "%i|%j"], capture_output=True, text=True, check=True).stdout
    return dict(line.split("|", 1) for line in listed.splitlines())


def extract(out: Path, *more: str, host: str = HOST, inventory: Path | None = None) -> dict:
    """`inv extract --json` (it returns once the job is submitted): what it printed."""
    code, launched = inv_json("extract", "--host", host, "--model", str(MODEL), "--data", str(DATA),
                              "--out", str(out), *more, inventory=inventory, timeout=600)
    assert code == 0 and launched["launched"], launched
    return launched


def ended(run: Path) -> dict:
    """The run's files once its supervisor wrote its outcome, exit.json (read directly: the lab is this
    machine; a resume removes it)."""
    return wait_for(f"run {run.name} to end", lambda: (run / "exit.json").exists() and run_files(run),
                    timeout=RUN_TIMEOUT_S)


def finished(launched: dict) -> dict:
    return ended(Path(launched["path"]))


def submitted(launched: dict, before: dict[str, str]) -> str:
    """The launch queued exactly one job, named for the run: its id."""
    job_id = launched["slurm"]["job_id"]
    new = {job: name for job, name in queue().items() if job not in before}
    assert new == {job_id: f"specrig-{launched['run_id']}"}, new
    return job_id


def assert_the_job_ran_the_runs_script(launched: dict) -> None:
    """The job's script is the one the code makes of the run's settings, and Slurm ran it: its output
    file, which slurmd opens when the job starts, is in the run directory; the supervisor recorded its
    attempt there."""
    run = Path(launched["path"])
    record = json.loads((run / "run.json").read_text())
    job_id = launched["slurm"]["job_id"]
    assert record["slurm"]["job_ids"] == [job_id] and Path(launched["slurm"]["script"]) == run / jobs.SCRIPT
    assert (run / jobs.SCRIPT).read_text() == jobs.script(record["slurm"]["settings"], run_path=str(run),
                                                          run_id=launched["run_id"], python=record["python"])
    assert (run / f"slurm-{job_id}.out").exists()
    assert json.loads((run / "status.json").read_text())["attempts"]


def test_extract_in_process_is_one_job_whose_states_equal_transformers(cluster, out):
    runnable = runnable_env_or_skip(cluster)
    before = queue()
    launched = extract(out, "--max-len", "512", "--batch-size", "4")
    submitted(launched, before)
    with phase("the job"):
        assert finished(launched)["state"] == SUCCEEDED
        assert_the_job_ran_the_runs_script(launched)
        code, status = inv_json("status", "--host", HOST, "--run", launched["run_id"])
        assert code == 0
        run = status["runs"][0]
        assert run["state"] == SUCCEEDED and run["slurm"]["job_id"] == launched["slurm"]["job_id"]
        # scontrol still knows the job for MinJobAge after its end.
        assert run["slurm"]["job"]["state"] in ("COMPLETED", "COMPLETING"), run["slurm"]
        logs = inv("logs", "--host", HOST, "--run", launched["run_id"], "-n", "400")
        assert logs.returncode == 0 and "[specrig-supervisor" in logs.stdout and "attempt 1: " in logs.stdout
    with phase("the states"):
        report = runnable.run_program("hidden_states_reference.py", str(out), str(MODEL))
        assert report["samples"] == CONVERSATIONS and report["bad_shapes"] == [], report
        assert max(report["max_abs_diff"].values()) < TOLERANCE, report


def server_mode_inventory(directory: Path, **changes) -> Path:
    """lab-slurm in server mode, in a hosts.yaml of its own in `directory` (with `changes`): speculators'
    client python, the server venv lab-server uses (the same files), patched as its tests patch it."""
    if not (CLIENT / "bin" / "python").exists():
        pytest.skip("server mode's environments are not built (inv lab.up --runnable)")
    ensure_patched("lab-server", inventory=REPO / "hosts.yaml")
    return private_inventory(directory, HOST, python=str(CLIENT / "bin" / "python"),
                             server_python="~/venv-server-0.32/bin/python",
                             env={"VLLM_CPU_KVCACHE_SPACE": 2, **LAB_SERVER_ENV}, **changes)


def test_extract_in_server_mode_is_one_job_whose_states_equal_transformers(cluster, out, tmp_path):
    inventory = server_mode_inventory(tmp_path)
    before = queue()
    launched = extract(out, "--max-len", "1024", "--max-samples", str(ROWS), inventory=inventory)
    submitted(launched, before)
    with phase("the job"):
        assert finished(launched)["state"] == SUCCEEDED, (Path(launched["path"]) / "driver.log").read_text()[-3000:]
        assert_the_job_ran_the_runs_script(launched)
    with phase("the states"):
        states_against_transformers(out, files=ROWS)


def as_lab_user_slurm(*words: str) -> None:
    """A Slurm command as the lab user, as they would type it on the login node."""
    subprocess.run(["su", "specrig", "-c", " ".join(words)], check=True, capture_output=True, text=True)


def test_a_job_array_shards_the_run_and_a_task_cancelled_is_resubmitted_alone(cluster, out):
    code, launched = inv_json("extract", "--host", HOST, "--model", str(MODEL), "--data", str(DATA), "--out", str(out),
                              "--max-len", "512", "--batch-size", "4", "--array", "3", "--skip-preflight", timeout=600)
    assert code == 0, launched
    array, sharded = launched["job_id"], launched["sharded_run_id"]
    paths = {run["task"]: WORKDIR / "runs" / run["run_id"] for run in launched["runs"]}
    with phase("one array, a task a shard"):
        # Pending, the array is one line (77_[0-2]); running, a line a task (77_0 ...).
        assert set(name for job, name in queue().items() if job.split("_")[0] == array) == {f"specrig-{sharded}"}
        for task, path in paths.items():
            record = json.loads((path / "run.json").read_text())
            assert record["shard"]["shard_index"] == task and record["shard"]["shard_count"] == 3
            assert record["slurm"]["job_ids"] == [f"{array}_{task}"]
            assert record["out"] == f"{out}/task-{task}"
    with phase("task 1 cancelled"):
        wait_for("task 1's first attempt", lambda: run_files(paths[1]).get("attempts"), timeout=300)
        as_lab_user_slurm("scancel", f"{array}_1")
        assert ended(paths[1])["state"] == STOPPED
        assert [ended(paths[task])["state"] for task in (0, 2)] == [SUCCEEDED, SUCCEEDED]
        code, partial = inv_json("gather", "--host", HOST, "--run", sharded, timeout=600)
        assert code == 1 and not partial["complete"] and partial["missing"], partial
    with phase("task 1 resubmitted alone"):
        before = queue()
        code, resumed = inv_json("resume", "--host", HOST, "--run", paths[1].name)
        assert code == 0, resumed
        again = resumed["slurm"]["job_id"]
        assert again.endswith("_1") and again != f"{array}_1"
        assert set(queue()) - set(before) <= {again, f"{again.split('_')[0]}_[1]"}
        assert ended(paths[1])["state"] == SUCCEEDED
    with phase("gather"):
        code, gathered = inv_json("gather", "--host", HOST, "--run", sharded, timeout=600)
        assert code == 0 and gathered["complete"], gathered
        assert gathered["dataset_samples"] == gathered["samples"] == CONVERSATIONS and not gathered["duplicated"]


def test_a_job_array_in_server_mode_shards_the_rows_as_speculators_does(cluster, out, tmp_path):
    inventory = server_mode_inventory(tmp_path)
    code, launched = inv_json("extract", "--host", HOST, "--model", str(MODEL), "--data", str(DATA), "--out", str(out),
                              "--max-len", "1024", "--max-samples", str(ROWS), "--concurrency", "2",
                              "--port", "18400", "--array", "2", "--skip-preflight", inventory=inventory, timeout=600)
    assert code == 0, launched
    paths = {run["task"]: WORKDIR / "runs" / run["run_id"] for run in launched["runs"]}
    with phase("a task a shard: speculators' --world-size and --rank"):
        for task, path in paths.items():
            plan = json.loads((path / "run.json").read_text())["server"]
            assert (plan["world_size"], plan["rank"], plan["port"]) == (2, task, 18400 + task), plan
            (argv,) = plan["generate_argvs"]  # one client process (--clients' default)
            assert " ".join(argv).endswith(f"--world-size 2 --rank {task}"), argv
    with phase("both tasks"):
        assert [ended(paths[task])["state"] for task in (0, 1)] == [SUCCEEDED, SUCCEEDED], \
            [log_text(paths[task])[-2000:] for task in (0, 1)]
    with phase("gather"):
        code, gathered = inv_json("gather", "--host", HOST, "--run", launched["sharded_run_id"], inventory=inventory,
                                  timeout=600)
        assert code == 0 and gathered["complete"], gathered
        assert gathered["dataset_samples"] == gathered["samples"] == ROWS and not gathered["duplicated"]
        for task in (0, 1):
            # speculators' contiguous chunks: 0-11 and 12-23.
            assert outputs.existing_indices(str(out / f"task-{task}")) == prepared.shard_indices(ROWS, None, 2, task)


#: Copies of the tiny chat dataset for the time-limit test: more than a job writes between its warning and
#: its end, and between the admin's requeue and the job's end (a job wrote 900 to 4400 a minute in the lab).
TIME_LIMIT_COPIES = 60


def admin(*words: str) -> None:
    """`scontrol <words>` as root, the cluster's admin."""
    subprocess.run(["scontrol", *words], check=True, capture_output=True, text=True)


def released(job_id: str) -> dict:
    """What Slurm says of the job, once let go of the hold Slurm 22.05 puts on a requeued job (pending two
    minutes, reason BeginTime): the admin lets it start now (StartTime=now), with its own limit again
    (hosts.yaml's slurm.time), so that the test waits on the run rather than on the hold."""
    job = jobs.lookup(job_id)
    if (job["state"], job["reason"]) == ("PENDING", "BeginTime"):
        admin("update", f"JobId={job_id}", "StartTime=now", f"TimeLimit={lab_entry_slurm()['time']}")
    return job


def sample_count(out: Path) -> int:
    return len(list(out.glob("data_*.pt")))


def test_a_job_requeued_by_its_time_limit_and_by_the_admin_finishes_every_sample_once(cluster, out):
    runnable_env_or_skip(cluster)
    data = WORKDIR / "test-data" / f"chat-x{TIME_LIMIT_COPIES}.jsonl"
    as_lab_user("mkdir", "-p", str(data.parent))
    as_lab_user("tee", str(data), input=DATA.read_text() * TIME_LIMIT_COPIES)
    code, launched = inv_json("extract", "--host", HOST, "--model", str(MODEL), "--data", str(data), "--out", str(out),
                              "--max-len", "512", "--batch-size", "4", "--skip-preflight", timeout=600)
    assert code == 0, launched
    run, job_id = Path(launched["path"]), launched["slurm"]["job_id"]
    with phase("the time limit, mid-run"):
        wait_for("the job's first sample", lambda: sample_count(out), timeout=RUN_TIMEOUT_S)
        # The admin shortens the job's limit to what it has run and two minutes more: within the warning's
        # 120 s (--signal=B:USR1@120 of its 30 minutes), so Slurm warns the job at its next look, mid-run,
        # however long the model's load took. The supervisor stops the attempt, which wrote samples, and the
        # job's shell requeues it.
        ran_min = formats.seconds(jobs.lookup(job_id)["run_time"]) // 60
        admin("update", f"JobId={job_id}", f"TimeLimit={ran_min + 2}")
        wait_for("the job to be requeued", lambda: "stopped (SIGUSR1)" in log_text(run), timeout=RUN_TIMEOUT_S)
        code, status = inv_json("status", "--host", HOST, "--run", launched["run_id"])
        assert code == 0 and status["runs"][0]["state"] in (RESTARTING, RUNNING, STARTING), status["runs"][0]
        assert 0 < sample_count(out) < CONVERSATIONS * TIME_LIMIT_COPIES
    with phase("requeued by the admin, as preemption does"):
        wait_for("the requeued job's attempt", lambda: released(job_id) and "attempt 2: " in log_text(run),
                 timeout=RUN_TIMEOUT_S)
        before = sample_count(out)
        wait_for("its first new sample", lambda: sample_count(out) > before, timeout=RUN_TIMEOUT_S)
        # Slurm ends the running job (SIGTERM, KillWait, SIGKILL) and queues it again, as PreemptMode=REQUEUE.
        admin("requeue", job_id)
    with phase("to the end"):
        def settled() -> dict | None:
            released(job_id)
            code, found = inv_json("status", "--host", HOST, "--run", launched["run_id"])
            return found["runs"][0] if found["runs"][0]["state"] not in ACTIVE_STATES else None

        last = wait_for("the run to end", settled, timeout=RUN_TIMEOUT_S, interval=5)
        assert last["state"] == SUCCEEDED, (last["slurm"], log_text(run)[-3000:])
        job = jobs.lookup(job_id)
        # The time limit's requeue and the admin's: three jobs, an attempt each.
        assert job["restarts"] == "2" and log_text(run).count("stopped (SIGUSR1)") == 1, (job, log_text(run)[-3000:])
        assert len(json.loads((run / "status.json").read_text())["attempts"]) == 3
    with phase("every sample once"):
        total = CONVERSATIONS * TIME_LIMIT_COPIES
        names = sorted(path.name for path in out.iterdir())
        assert [name for name in names if name.startswith("data_") and name.endswith(".pt")] == sorted(
            f"data_{i}.pt" for i in range(total))
        assert not [name for name in names if ".tmp." in name]
        # Each one whole, as a resume's scan checks it (`inv gather`'s check; the one-job test compares the
        # states with transformers').
        found = verify_output(cluster.host(HOST), launched["run_id"])
        assert found["indices"] == list(range(total)) and found["unloadable"] == [], found["unloadable"]


def test_a_job_warned_of_its_time_limit_before_any_sample_fails_naming_slurm_time_and_is_not_requeued(cluster, out,
                                                                                                    tmp_path):
    runnable_env_or_skip(cluster)
    launched = extract(out, "--max-len", "512", "--skip-preflight")
    run, job_id = Path(launched["path"]), launched["slurm"]["job_id"]
    with phase("warned while the model loads"):
        wait_for("the model's load", lambda: run_files(run)["heartbeat"].get("phase") == "loading", timeout=300)
        # The warning Slurm gives before the time limit (--signal=B:USR1@<s>: USR1 to the job's shell alone),
        # given now, as a limit too short for the model's load would. (slurmctld looks at time limits about every
        # 30 s, and the lab's load takes 10 to 75 s: a real short limit's warning cannot be placed in it.)
        as_lab_user_slurm("scancel", "--batch", "--signal=USR1", job_id)
        assert ended(run)["state"] == FAILED, log_text(run)[-3000:]
        code, status = inv_json("status", "--host", HOST, "--run", launched["run_id"])
        assert code == 0 and status["runs"][0]["state"] == FAILED
        failure = status["runs"][0]["last_failure"]
        assert failure["kind"] == TIME_LIMIT_TOO_SHORT and not failure["retryable"], failure
        assert ", while loading, before any sample was written (slurm.time 00:30:00," in failure["explain"], failure
        assert failure["advice"].startswith("set a longer slurm.time for the host in hosts.yaml (now 00:30:00)")
    with phase("not requeued"):
        job = wait_for("the job to end", lambda: (lambda job: None if jobs.holds_processes(job) else job)(
            jobs.lookup(job_id)), timeout=300)
        assert (job["state"], job["restarts"]) == ("COMPLETED", "0"), job
        log = log_text(run)
        assert log.count("stopped (SIGUSR1)") == 1 and "; not requeued" in log, log[-3000:]
        assert not list(out.glob("data_*.pt"))
    with phase("resumed with a longer slurm.time, as the advice says"):
        longer = private_inventory(tmp_path, HOST, python=PRIVATE["python"],
                                   slurm=dict(lab_entry_slurm(), time="00:45:00"))
        code, resumed = inv_json("resume", "--host", HOST, "--run", launched["run_id"], inventory=longer)
        assert code == 0, resumed
        again = resumed["slurm"]["job_id"]
        assert again != job_id and jobs.lookup(again)["time_limit"] == "00:45:00"
        assert ended(run)["state"] == SUCCEEDED, log_text(run)[-3000:]


def log_text(run: Path) -> str:
    """The run's driver.log ("" until its supervisor wrote it)."""
    try:
        return (run / "driver.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def lab_entry_slurm() -> dict:
    """The shipped hosts.yaml's lab-slurm `slurm:`."""
    return yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"][HOST]["slurm"]


def jobs_named(name: str) -> set[str]:
    """The ids of the jobs of that name the controller knows (queued, running, or ended within MinJobAge)."""
    shown = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True).stdout
    return {line.split()[0].removeprefix("JobId=") for line in shown.splitlines() if f" JobName={name} " in line}


def test_smoke_runs_its_call_as_one_job(cluster):
    before = jobs_named("specrig-smoke")
    result = inv("smoke", "--host", HOST, "--model", str(MODEL), timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke passed on lab-slurm" in " ".join(result.stdout.split())
    assert len(jobs_named("specrig-smoke") - before) == 1
    assert not list((HOME / ".cache" / "specrig" / jobs.CALLS).iterdir())  # the call's directory is removed


def test_a_pending_job_shows_slurms_reason_and_stop_leaves_no_job_and_no_process(cluster, out):
    # Every GPU of both nodes held by another job: the run's job waits for Resources.
    holder = subprocess.run(["su", "specrig", "-c", "cd && sbatch --parsable --nodes=2 "
                             f"--gres=gpu:{lab_slurm.GPUS_PER_NODE} --time=5 --output=/dev/null --wrap='sleep 300'"],
                            capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        launched = extract(out, "--max-len", "512", "--skip-preflight")
        job_id = launched["slurm"]["job_id"]
        with phase("pending"):
            def waiting() -> dict | None:
                code, status = inv_json("status", "--host", HOST, "--run", launched["run_id"])
                assert code == 0
                run = status["runs"][0]
                job = run["slurm"]["job"]
                # The reason is None until the scheduler has looked at the job, the start time Unknown until
                # the backfill scheduler's next pass (30 s by default) has estimated it.
                return run if job["reason"] != "None" and job["start_time"] != "Unknown" else None

            run = wait_for("Slurm's reason and start estimate of the pending job", waiting, timeout=180, interval=3)
            job = run["slurm"]["job"]
            assert run["state"] == STARTING and (job["state"], job["reason"]) == ("PENDING", "Resources"), run
            shown = inv("status", "--host", HOST, "--run", launched["run_id"], env={"COLUMNS": "200"})
            assert f"job {job_id} pending: Resources, start estimate {job['start_time']}" in shown.stdout, shown.stdout
        with phase("running"):
            subprocess.run(["scancel", holder], check=True)
            wait_for("the run's supervisor to start its attempt",
                     lambda: run_files(Path(launched["path"])).get("attempts"), timeout=300)
        with phase("stop"):
            code, stopped = inv_json("stop", "--host", HOST, "--run", launched["run_id"], timeout=300)
            assert code == 0 and stopped["clean"], stopped
            assert stopped["slurm"]["checked_here"] and stopped["left"] == []
            assert job_id not in queue()
            marker = launched["path"] + "/"
            alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
            assert alive == [], alive
            assert run_files(Path(launched["path"]))["state"] == STOPPED
    finally:
        subprocess.run(["scancel", holder])


@pytest.mark.parametrize("slurm, words", [
    ({"partition": "gpu", "gres": f"gpu:{lab_slurm.GPUS_PER_NODE + 1}"}, ["no node of partition 'gpu' has gres"]),
    ({"partition": "debug", "time": "01:00:00"}, ["slurm.time 01:00:00 is over the limit of partition 'debug'"]),
    ({"partition": "gpus"}, ["the cluster has no partition 'gpus'"]),
    ({"nodes": 2}, ["slurm.nodes is 2"]),
    ({"time": "2h"}, ["'2h' is not a Slurm time"]),
], ids=["more GPUs than a node has", "time over the limit", "no such partition", "two nodes", "bad time"])
def test_a_job_that_could_never_run_is_refused_in_one_line_and_nothing_is_queued(cluster, make_inventory,
                                                                                   trusted_known_hosts, slurm, words):
    entry = {key: value for key, value in lab_entry().items() if key not in ("extract", "description")}
    entry.update(scheduler="slurm", python="~/venv-cpu/bin/python", workdir=str(WORKDIR), slurm=slurm)
    inventory = make_inventory({"hosts": {"big": entry}})
    trusted_known_hosts(inventory)
    before, runs_before = queue(), sorted((WORKDIR / "runs").glob("*"))
    result = inv("extract", "--host", "big", "--model", str(MODEL), "--data", str(DATA),
                 "--out", str(WORKDIR / "test-out" / "never"), inventory=inventory, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(word in lines[0] for word in words), result.stderr
    assert queue() == before and sorted((WORKDIR / "runs").glob("*")) == runs_before


def test_verify_dataset_of_a_job_array_links_the_tasks_outputs_for_the_trainer_and_names_a_missing_row(cluster, out):
    """Issue 28: `inv verify-dataset --run ARRAY` checks every task's output on the login node; the trainer reads
    one directory, so the tasks' files are linked into one, which the command names; a file gone from a task's
    output is named with its row."""
    code, launched = inv_json("extract", "--host", HOST, "--model", str(MODEL), "--data", str(DATA), "--out", str(out),
                              "--max-len", "512", "--batch-size", "4", "--max-samples", "6", "--array", "2",
                              "--skip-preflight", timeout=600)
    assert code == 0, launched
    sharded = launched["sharded_run_id"]
    assert [ended(WORKDIR / "runs" / run["run_id"])["state"] for run in launched["runs"]] == [SUCCEEDED, SUCCEEDED]
    code, found = inv_json("verify-dataset", "--host", HOST, "--run", sharded, timeout=900)
    assert code == 0 and found["trainable"] and found["counts"]["files"] == 6, found
    assert sorted(share["out"] for share in found["shares"]) == [f"{out}/task-0", f"{out}/task-1"], found["shares"]
    merged = Path(found["merged"])
    assert sorted(os.listdir(merged)) == sorted([f"data_{row}.pt" for row in range(6)]
                                                + ["specrig-train-command.sh", "specrig-verified.json"])
    assert os.readlink(merged / "data_3.pt") == f"{out}/task-1/data_3.pt"  # in process, task k holds i % 2 == k
    assert found["command"][found["command"].index("--data-path") + 1] == str(merged), found["command"]

    as_lab_user("rm", f"{out}/task-1/data_3.pt")
    code, found = inv_json("verify-dataset", "--host", HOST, "--run", sharded, timeout=900)
    assert code == 1 and found["bad"] == [{"row": 3, "reason": "no file: data_3.pt is missing"}], found
    as_lab_user("rm", "-rf", str(merged))
