"""The lab's Slurm cluster (`inv lab.up --slurm`) and doctor on its login node, host lab-slurm: the real
slurmctld and two slurmd, jobs submitted through the lab's sshd as the lab user, as on a cluster.

They skip when the Slurm lab is not built, and fail then under CI's SPECRIG_REQUIRE_LAB=1: .ci/tests
builds it (`inv lab.up --runnable --hosts 3 --slurm`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from specrig.lab import READY
from specrig.lab import slurm as lab_slurm
from specrig.slurm_settings import formats
from specrig.transport.quoting import quote_word
from support.lab import inv, lab_entry, require_lab
from support.paths import REPO


@pytest.fixture(scope="module")
def cluster(lab):
    require_lab(lab_slurm.slurm_is_up(), "lab Slurm not built: run `inv lab.up --runnable --slurm` as root")
    # lab-slurm's python is the runnable ~/venv-cpu, on the home the nodes share.
    require_lab(READY.read_text() == "runnable\n", "lab-slurm needs the runnable environments: inv lab.up --runnable")
    return lab.host("lab-slurm")


def login(*words: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A command on the login node (the lab's sshd), as the lab user; every word quoted for its shell."""
    host = "specrig@127.0.0.1"
    return subprocess.run(["ssh", "-p", "2222", "-i", str(REPO / ".lab" / "client_key"), "-o", "BatchMode=yes",
                           "-o", f"UserKnownHostsFile={REPO / '.specrig' / 'known_hosts'}", host,
                           " ".join(quote_word(word) for word in words)],
                          capture_output=True, text=True, timeout=timeout)


def test_each_node_is_its_own_slurmd_of_a_multiple_slurmd_build(cluster):
    # What the lab's two nodes on one machine rest on (specrig/lab/slurm.py): Debian's build says so itself.
    config = login("scontrol", "show", "config")
    assert any(line.split() == ["MULTIPLE_SLURMD", "=", "Yes"] for line in config.stdout.splitlines())
    nodes = login("sinfo", "-h", "-N", "-o", "%N %T")
    assert {line.split()[0] for line in nodes.stdout.splitlines()} == set(lab_slurm.NODES)


def test_a_two_node_job_runs_a_step_beside_another_on_each_node(cluster):
    # The head's role and the workers' of a multi-node job: a second step with --overlap on the nodes
    # a first one holds.
    out = f".cache/specrig-test-overlap-{uuid.uuid4().hex}.out"  # relative: to the job's directory, the home
    script = ("srun --nodes=2 --ntasks=2 sleep 60 & sleep 2; "
              "srun --overlap --nodes=2 --ntasks=2 printenv SLURMD_NODENAME; kill $!")
    # --error apart: the first step's end, killed, is reported there.
    submitted = login("sbatch", "--wait", "--nodes=2", "--time=2", f"--output={out}", "--error=/dev/null",
                      f"--wrap={script}")
    printed = login("cat", out)
    login("rm", "-f", out)
    assert submitted.returncode == 0, submitted.stderr
    assert sorted(printed.stdout.split()) == sorted(lab_slurm.NODES)


def test_gpus_are_counted_allocated_and_refused_beyond_a_node(cluster):
    two = login("srun", f"--gres=gpu:{lab_slurm.GPUS_PER_NODE}", "--time=1", "printenv", "CUDA_VISIBLE_DEVICES")
    assert two.returncode == 0 and two.stdout.strip() == ",".join(map(str, range(lab_slurm.GPUS_PER_NODE)))
    more = login("srun", f"--gres=gpu:{lab_slurm.GPUS_PER_NODE + 1}", "--time=1", "true")
    assert more.returncode != 0 and "Requested node configuration is not available" in more.stderr


def test_an_array_runs_every_task(cluster):
    name = f"specrig-test-array-{uuid.uuid4().hex}"
    done = login("sbatch", "--wait", "--array=0-2", "--time=1", f"--output=.cache/{name}-%a.out",
                 "--wrap=printenv SLURM_ARRAY_TASK_ID")
    printed = [login("cat", f".cache/{name}-{task}.out").stdout.strip() for task in range(3)]
    login("sh", "-c", f"rm -f .cache/{name}-*.out")
    assert done.returncode == 0, done.stderr
    assert printed == ["0", "1", "2"]


def doctor_json() -> dict:
    result = inv("doctor", "--host", "lab-slurm", "--json", timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_doctor_reports_the_cluster_as_its_commands_see_it(cluster):
    name = f"specrig-test-{uuid.uuid4().hex[:8]}"
    job = login("sbatch", "--parsable", f"--job-name={name}", "--time=2", "--output=/dev/null", "--wrap=sleep 120")
    try:
        slurm = doctor_json()["slurm"]
    finally:
        login("scancel", job.stdout.strip())
    assert slurm["errors"] == {}
    assert slurm["version"] == subprocess.run(["sinfo", "--version"], capture_output=True, text=True).stdout.split()[-1]
    partitions = {partition["name"]: partition for partition in slurm["partitions"]}
    assert set(partitions) == set(lab_slurm.PARTITIONS)
    for name_, made in lab_slurm.PARTITIONS.items():
        found = partitions[name_]
        assert found["default"] is made["default"] and found["nodes"]["total"] == len(made["nodes"])
        assert found["time_limit_s"] == formats.seconds(made["max_time"])
        assert found["gpus_per_node"] == lab_slurm.GPUS_PER_NODE and found["available"] == "up"
    assert [(entry["id"], entry["name"]) for entry in slurm["jobs"]] == [(job.stdout.strip(), name)]
    assert slurm["request_problems"] == []  # hosts.yaml's lab-slurm asks for what the lab has
    home = slurm["shared_home"]
    assert home["shared"] is True, home
    assert login("test", "-e", home["path"]).returncode == 1  # the test's file is gone again


def test_doctor_view_fits_80_columns(cluster):
    result = inv("doctor", "--host", "lab-slurm", timeout=180, env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    text = result.stdout
    assert "Slurm: " in text and "partitions" in text and "gpu*" in text and "shared with the compute nodes" in text


def test_doctor_without_a_controller_reports_what_failed(cluster, make_inventory, trusted_known_hosts):
    # The lab's slurm.conf with the controller's port where nothing listens, in a folder the lab user
    # reads: the real commands, failing as they do when slurmctld is down.
    folder = Path(tempfile.mkdtemp(prefix="specrig-slurm-down-"))
    try:
        os.chmod(folder, 0o755)
        # MessageTimeout: each command gives up on the controller after 1-2 s instead of its default 10 s of
        # retries (the same failure, sooner: doctor asks four of them, twice here).
        text = lab_slurm.SLURM_CONF.read_text().replace(f"SlurmctldPort={lab_slurm.CONTROLLER_PORT}",
                                                         "SlurmctldPort=16899") + "MessageTimeout=2\n"
        (folder / "slurm.conf").write_text(text)
        os.chmod(folder / "slurm.conf", 0o644)
        entry = {key: value for key, value in lab_entry().items() if key not in ("extract", "description")}
        entry.update(scheduler="slurm", python=cluster.python, env={"SLURM_CONF": str(folder / "slurm.conf")})
        inventory = make_inventory({"hosts": {"down": entry}})
        trusted_known_hosts(inventory)
        result = inv("doctor", "--host", "down", "--json", inventory=inventory, timeout=180)
        shown = inv("doctor", "--host", "down", inventory=inventory, timeout=180, env={"COLUMNS": "80"})
    finally:
        shutil.rmtree(folder)
    assert result.returncode == 0, result.stderr
    slurm = json.loads(result.stdout)["slurm"]
    assert slurm["version"]  # sinfo --version asks no controller
    assert slurm["partitions"] is None and slurm["jobs"] is None and slurm["shared_home"] is None
    # Slurm's own words, or that it gave none in time (its retries take their own while).
    assert slurm["errors"]["partitions"].startswith("sinfo ") and slurm["errors"]["jobs"].startswith("squeue ")
    assert shown.returncode == 0 and "partitions: sinfo " in shown.stdout and "jobs: squeue " in shown.stdout


def test_doctor_says_why_the_request_could_never_run(cluster, make_inventory, trusted_known_hosts):
    entry = {key: value for key, value in lab_entry().items() if key not in ("extract", "description")}
    too_much = {"partition": "debug", "gres": f"gpu:{lab_slurm.GPUS_PER_NODE + 1}", "time": "01:00:00"}
    entry.update(scheduler="slurm", python=cluster.python, slurm=too_much)
    inventory = make_inventory({"hosts": {"big": entry}})
    trusted_known_hosts(inventory)
    result = inv("doctor", "--host", "big", "--json", inventory=inventory, timeout=180)
    assert result.returncode == 0, result.stderr
    problems = json.loads(result.stdout)["slurm"]["request_problems"]
    assert [(problem["check"], problem["partition"]) for problem in problems] == [("gres", "debug"), ("time", "debug")]
    shown = inv("doctor", "--host", "big", inventory=inventory, timeout=180, env={"COLUMNS": "80"})
    assert "could never run here" in shown.stdout and "over the limit of partition 'debug'" in shown.stdout
