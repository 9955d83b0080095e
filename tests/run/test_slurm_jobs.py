"""A run as one Slurm job, as data (remote/slurm/jobs.py): the job script made from hosts.yaml's
`slurm:` settings (and docs/slurm.md showing exactly what it makes), scontrol's real lines
(tests/fixtures/slurm/) read, and how `inv status` words the job."""
import json
from pathlib import Path

import pytest
import yaml

from base import rundir, slurm_queries
from slurm import jobs
from specrig.contract import FAILED, IN_PROCESS, RESTARTING, RUNNING, SERVER, SLURM_SETTINGS, STARTING, STOPPED
from specrig.slurm.view import slurm_job_text
from support.paths import REPO

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RUN_ID = "20261201-203745-i4h0"
RUN = f"/home/specrig/specrig-slurm/runs/{RUN_ID}"


def lab_settings(name: str = "lab-slurm") -> dict:
    """The shipped hosts.yaml's `slurm:` of a host, every default filled in (as inventory.py does)."""
    given = yaml.safe_load((REPO / "hosts.yaml").read_text())["hosts"][name]["slurm"]
    return {**{key: spec["default"] for key, spec in SLURM_SETTINGS.items()}, **given}


#: The scripts docs/slurm.md shows: lab-slurm in-process (its python, ~/venv-cpu) and in server mode
#: (speculators' client python: the supervisor runs there, and starts the vLLM server on server_python).
DOC_SCRIPTS = {IN_PROCESS: "/home/specrig/venv-cpu/bin/python", SERVER: "/home/specrig/venv-spec-0.9/bin/python"}


@pytest.mark.parametrize("mode", DOC_SCRIPTS)
def test_docs_show_the_job_script_the_code_makes(mode):
    made = jobs.script(lab_settings(), run_path=RUN, run_id=RUN_ID, python=DOC_SCRIPTS[mode])
    assert f"```bash\n{made}```" in (REPO / "docs" / "slurm.md").read_text(), \
        f"docs/slurm.md no longer shows the {mode} job script; put this in its place:\n{made}"


#: The smoke call's job docs/slurm.md shows: a call directory and the bundle's entry.py on the shared home.
CALL_DIR = "/home/specrig/.cache/specrig/slurm-calls/smoke-k2j4x9"
ENTRY = "/home/specrig/.cache/specrig/bundles/3f1c0d9e/remote/entry.py"


def test_docs_show_the_smoke_job_script_the_code_makes():
    made = jobs.call_script(lab_settings(), directory=CALL_DIR, command="smoke", python=DOC_SCRIPTS[IN_PROCESS],
                            entry=ENTRY)
    assert made.splitlines()[-1] == f"exec /home/specrig/venv-cpu/bin/python {ENTRY} {CALL_DIR}/call.json"
    assert f"```bash\n{made}```" in (REPO / "docs" / "slurm.md").read_text(), \
        f"docs/slurm.md no longer shows the smoke job script; put this in its place:\n{made}"


#: The job array docs/slurm.md shows: three tasks' runs and the array's directory.
SHARDED = "sharded-20261201-205303-zzy3"
TASK_RUNS = [f"/home/specrig/specrig-slurm/runs/20261201-205303-{suffix}" for suffix in ("fvy6", "qm17", "22th")]


def test_docs_show_the_job_array_script_the_code_makes():
    made = jobs.array_script(lab_settings(), directory=f"/home/specrig/specrig-slurm/runs/{SHARDED}",
                             sharded_run_id=SHARDED, run_paths=TASK_RUNS, python=DOC_SCRIPTS[IN_PROCESS])
    assert "#SBATCH --array=0-2" in made.splitlines()
    assert f"```bash\n{made}```" in (REPO / "docs" / "slurm.md").read_text(), \
        f"docs/slurm.md no longer shows the job array script; put this in its place:\n{made}"


def test_every_setting_is_an_sbatch_option_and_specrig_adds_its_own_last():
    settings = lab_settings("hopper-login")
    made = jobs.script(settings, run_path=RUN, run_id=RUN_ID, python="/shared/venvs/eagle3/bin/python")
    options = [line.removeprefix("#SBATCH ") for line in made.splitlines() if line.startswith("#SBATCH ")]
    owned = [f"{spec['sbatch']}={settings[name]}" for name, spec in SLURM_SETTINGS.items()
             if spec["sbatch"] and settings.get(name) is not None]
    assert options[:len(owned)] == owned
    assert options[len(owned):len(owned) + len(settings["extra_sbatch"])] == settings["extra_sbatch"]
    assert options[-6:] == [f"--job-name=specrig-{RUN_ID}", f"--chdir={RUN}", f"--output={RUN}/slurm-%j.out",
                            f"--error={RUN}/slurm-%j.err", "--requeue", "--signal=B:USR1@120"]
    # The supervisor runs in the job as run/launching.py starts it over SSH: the run's python, its code/, its directory.
    lines = made.splitlines()
    assert f"RUN={RUN}" in lines and '/shared/venvs/eagle3/bin/python "$RUN/code/run/supervisor.py" "$RUN" &' in lines


@pytest.mark.parametrize("time, seconds", [(None, 120), ("04:00:00", 120), (2, 30), ("00:04:00", 60), (1, 15)])
def test_the_warning_before_the_time_limit_fits_a_short_limit(time, seconds):
    assert jobs.signal_before_end_s({"time": time}) == seconds
    assert f"#SBATCH --signal=B:USR1@{seconds}" in jobs.script({**lab_settings(), "time": time}, run_path=RUN,
                                                               run_id=RUN_ID, python="/p/python").splitlines()


def test_a_setting_left_to_the_cluster_is_no_option():
    made = jobs.script({**lab_settings(), "partition": None, "time": None}, run_path=RUN, run_id=RUN_ID,
                       python="/p/python")
    assert "--partition" not in made and "--time" not in made and "#SBATCH --gres=gpu:1" in made


def test_a_run_directory_an_sbatch_line_cannot_hold_is_refused():
    with pytest.raises(jobs.JobRefused, match="holds a space"):
        jobs.script(lab_settings(), run_path="/home/a user/runs/x", run_id="x", python="/p/python")


def test_scontrol_lines_are_read_as_the_job_it_describes():
    running = slurm_queries.parse_job((FIXTURES / "running.scontrol").read_text())
    assert (running["state"], running["nodes"], running["batch_host"], running["time_limit"]) == (
        "RUNNING", "lab-node1", "lab-node1", "00:30:00")
    pending = slurm_queries.parse_job((FIXTURES / "pending.scontrol").read_text())
    assert (pending["state"], pending["reason"], pending["start_time"], pending["nodes"]) == (
        "PENDING", "Resources", "Unknown", "")
    assert slurm_queries.holds_processes(running) and slurm_queries.holds_processes(pending)
    assert not slurm_queries.holds_processes({"state": "CANCELLED"}) and not slurm_queries.holds_processes({"state": None})


@pytest.mark.parametrize("job, text", [
    ({"state": "PENDING", "reason": "Resources", "start_time": "2026-12-01T21:00:00"},
     "job 7 pending: Resources, start estimate 2026-12-01T21:00:00"),
    ({"state": "PENDING", "reason": "Priority", "start_time": "Unknown"}, "job 7 pending: Priority, no start estimate yet"),
    ({"state": "PENDING", "reason": "None", "start_time": "Unknown"}, "job 7 pending: the scheduler has not weighed it yet"),
    ({"state": "RUNNING", "nodes": "lab-node1", "run_time": "00:01:02", "time_limit": "00:30:00"},
     "job 7 running on lab-node1, 00:01:02 of 00:30:00"),
    ({"state": "TIMEOUT", "reason": "TimeLimit"}, "job 7 TIMEOUT (TimeLimit)"),
    ({"state": None, "detail": "no longer in the queue, and sacct has no record: sacct failed (exit 1): Slurm "
                               "accounting storage is disabled"},
     "job 7: no longer in the queue, and sacct has no record: sacct failed (exit 1): Slurm accounting storage is "
     "disabled"),
])
def test_status_words_the_job_as_slurm_says_it(job, text):
    assert slurm_job_text({"job_id": "7", "job": job}) == text


def test_the_filesystem_of_a_path_is_its_longest_mount():
    assert jobs.filesystem_type("/proc/self") == "proc"
    assert jobs.filesystem_type("/") is not None


def run_between_jobs(tmp_path: Path, *, status_state: str, exit_state: str | None, job_file: str) -> rundir.RunDir:
    """A Slurm run's directory as its files say, and what Slurm said of its job (a captured scontrol line):
    the answer state() weighs, given as the one lookup a RunDir makes."""
    (tmp_path / "run.json").write_text(json.dumps({"slurm": {"job_id": "41", "job_ids": ["41"]}}))
    (tmp_path / "status.json").write_text(json.dumps({"state": status_state}))
    if exit_state:
        (tmp_path / "exit.json").write_text(json.dumps({"state": exit_state}))
    run = rundir.RunDir(str(tmp_path))
    run._slurm_job = dict(slurm_queries.parse_job((FIXTURES / job_file).read_text()), job_id="41", source="scontrol")
    return run


@pytest.mark.parametrize("status_state, exit_state, job_file, state", [
    (STOPPED, STOPPED, "requeued.scontrol", RESTARTING),  # requeued at its time limit, held
    (STOPPED, None, "running.scontrol", STARTING),  # the next job removed exit.json; its supervisor not up yet
    (FAILED, None, "pending.scontrol", STARTING),  # `inv resume` submitted it: queued
    (RUNNING, None, "running.scontrol", RUNNING),
    (STOPPED, STOPPED, "ended.scontrol", STOPPED),
], ids=["requeued, held", "requeued, starting", "resumed, queued", "running", "ended"])
def test_a_slurm_runs_state_between_its_jobs_is_active_while_its_job_is(tmp_path, status_state, exit_state,
                                                                          job_file, state):
    assert run_between_jobs(tmp_path, status_state=status_state, exit_state=exit_state,
                            job_file=job_file).state() == state


#: The multi-node job docs/slurm.md shows: lab-slurm with two nodes and a fabric interface, in server mode.
NODES_JOB = "nodes-20261202-002818-letv"
NODE_RUNS = [f"/home/specrig/specrig-slurm/runs/20261202-0028{suffix}" for suffix in ("18-qrv2", "21-mhum")]


def nodes_script(**changes) -> str:
    return jobs.nodes_script({**lab_settings(), "nodes": 2, **changes},
                             directory=f"/home/specrig/specrig-slurm/runs/{NODES_JOB}", job_id=NODES_JOB,
                             run_paths=NODE_RUNS, python=DOC_SCRIPTS[SERVER])


def test_docs_show_the_multi_node_job_script_the_code_makes():
    made = nodes_script(fabric_interface="ib0")
    assert "#SBATCH --nodes=2" in made.splitlines()
    assert f"```bash\n{made}```" in (REPO / "docs" / "slurm.md").read_text(), \
        f"docs/slurm.md no longer shows the multi-node job script; put this in its place:\n{made}"


def test_the_multi_node_script_pins_the_fabric_only_when_hosts_yaml_names_one_and_keeps_supervised_whole():
    pinned, unpinned = nodes_script(fabric_interface="ib0"), nodes_script()
    assert "export NCCL_SOCKET_IFNAME=ib0 GLOO_SOCKET_IFNAME=ib0" in pinned.splitlines()
    assert "SOCKET_IFNAME" not in unpinned
    # The head's lines are a one-node run's, unchanged (the worker steps come before them).
    assert "\n".join(jobs.supervised(DOC_SCRIPTS[SERVER])) in unpinned
    # The head is the allocation's first node: where the batch script runs; the workers' steps name theirs.
    assert 'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))' in unpinned
    assert 'srun --overlap --nodes=1 --ntasks=1 -w "${NODES[$rank]}"' in unpinned


def test_a_multi_node_job_directory_a_sbatch_line_cannot_hold_is_refused():
    with pytest.raises(jobs.JobRefused, match="holds a space"):
        jobs.nodes_script(lab_settings(), directory="/tmp/a b", job_id=NODES_JOB, run_paths=NODE_RUNS, python="py")


def test_a_task_resubmitted_alone_carries_hosts_yamls_slurm_settings_now():
    """A task resumed after `time-limit-too-short` takes the longer slurm.time its advice asks for: sbatch's
    command line overrides the array script's #SBATCH lines."""
    argv = jobs.task_argv("/runs/x/slurm-job.sh", 2, {**lab_settings(), "time": "01:30:00"})
    assert argv[:3] == ["sbatch", "--parsable", "--array=2"] and argv[-1] == "/runs/x/slurm-job.sh"
    assert "--time=01:30:00" in argv and "--requeue" in argv and "--signal=B:USR1@120" in argv
    assert argv[3:-1] == jobs.settings_options({**lab_settings(), "time": "01:30:00"}) + jobs.requeue_options(
        {**lab_settings(), "time": "01:30:00"})
