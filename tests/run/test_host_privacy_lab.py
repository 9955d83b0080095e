"""The two probes of issue 16, on the real lab host over real SSH, as a user would meet them.

Secrets at rest: a token in a host's hosts.yaml `env:` reaches the job (at launch and at resume) and is
written in no file on the host; everything specrig writes there (the run, the call file, the bundle, the
cache) is its user's alone, which another lab user (specrig-bash) finds when it tries to read it; nothing
specrig prints holds the token. Terminal escapes: a log line that would retitle the terminal, clear it and
write its clipboard is shown escaped by `inv logs` and `inv status` on a terminal (a pty), as it is by
`inv logs --raw`, and as valid JSON by `--json`.

The job is a small stdlib program in the driver's place (the driver's argv and heartbeat contract), run by
the lab's analysis venv: it logs the sha256 of the variables it sees, its umask, and the three sequences,
then beats until it is stopped.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from specrig.errors import RemoteScriptError, SpecrigError
from specrig.inventory import load_inventory
from specrig.run.live import render, samples_bar
from specrig.run.runs import launch_args, runs_call
from specrig.run.settings import Request
from specrig.transport import connect
from support.lab import inv, lab_entry
from support.patchenv import as_lab_user, lab_home
from support.paths import REPO

OTHER_USER = "specrig-bash"
SECRET = "hf_" + uuid.uuid4().hex  # the token of this test session
OLD_SECRET = "hf_old_" + uuid.uuid4().hex  # one that an older specrig stored in a run.json
WORKDIR = "specrig-privacy-" + uuid.uuid4().hex[:8]  # in the lab user's home
TITLE, CLEAR, CLIPBOARD = "\x1b]0;pwned\x07", "\x1b[2J", "\x1b]52;c;cm0gLXJmIH4=\x07"
ATTACK_LINES = [f"{TITLE}retitled", f"{CLEAR}cleared", f"{CLIPBOARD}clipboard"]

DRIVER = r'''
import hashlib, json, os, sys, time
with open(sys.argv[1]) as handle:
    args = json.load(handle)
for name in ("HF_TOKEN", "SPECRIG_TEST_OLD"):
    value = os.environ.get(name)
    print("env %s sha256=%s" % (name, hashlib.sha256(value.encode()).hexdigest() if value is not None else "unset"))
mask = os.umask(0)
os.umask(mask)
print("umask %03o" % mask)
for line in json.loads(os.environ.get("SPECRIG_TEST_LINES", "[]")):
    print(line)
sys.stdout.flush()
while True:
    beat = {"phase": "extracting", "samples_done": 0, "samples_total": 10, "updated_at": time.time(),
            "pid": os.getpid()}
    with open(args["heartbeat"] + ".tmp", "w") as handle:
        json.dump(beat, handle)
    os.replace(args["heartbeat"] + ".tmp", args["heartbeat"])
    time.sleep(0.5)
'''


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@pytest.fixture(scope="module")
def inventory(lab, tmp_path_factory):
    """hosts.yaml with the lab host, a token in its `env:`, and a workdir of this module's own."""
    directory = tmp_path_factory.mktemp("privacy")
    entry = lab_entry(workdir=f"~/{WORKDIR}", env={"HF_TOKEN": SECRET,
                                                   "SPECRIG_TEST_LINES": json.dumps(ATTACK_LINES)})
    path = directory / "hosts.yaml"
    path.write_text(yaml.safe_dump({"hosts": {"lab": entry}}))
    (directory / ".specrig").mkdir()
    (directory / ".specrig" / "known_hosts").write_bytes((REPO / ".specrig" / "known_hosts").read_bytes())
    yield path
    as_lab_user("rm", "-rf", str(lab_home() / WORKDIR))


@pytest.fixture(scope="module")
def host(inventory):
    return load_inventory(inventory).host("lab")


@pytest.fixture(scope="module")
def run(host):
    """A run launched as `inv extract` launches it (launch_args: hosts.yaml `env:` with it), with DRIVER in the
    driver's place; its id, once the job has logged what it sees."""
    program = lab_home() / WORKDIR / "program" / "driver.py"
    as_lab_user("mkdir", "-p", str(program.parent))
    as_lab_user("tee", str(program), input=DRIVER)
    request = Request(driver_args={"output_dir": f"~/{WORKDIR}/out"}, options={"stall_timeout_s": 600},
                      env=dict(host.env))
    with connect(host) as remote:
        launched = runs_call(remote, host, "launch", launch_args(host, request, driver_program=str(program)))
        wait_for_log(remote, host, launched["run_id"], "clipboard", count=1)
    yield launched["run_id"]
    with connect(host) as remote:
        runs_call(remote, host, "stop", {"run": launched["run_id"]}, timeout=120)


def wait_for_log(remote, host, run_id: str, text: str, *, count: int, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = runs_call(remote, host, "logs", {"run": run_id, "lines": 1000})["text"]
        if log.count(text) >= count:
            return log
        time.sleep(0.5)
    raise AssertionError(f"run {run_id}: {text!r} not logged {count} time(s): {log[-2000:]}")


def run_dir(run_id: str) -> Path:
    return lab_home() / WORKDIR / "runs" / run_id


def cache() -> Path:
    return lab_home() / ".cache" / "specrig"


def not_private(top: Path) -> list[str]:
    """Everything under `top` (itself included) that is not the lab user's alone: directories 0700, files 0600."""
    found = []
    for path in [top, *top.rglob("*")]:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            continue
        want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if stat.S_IMODE(info.st_mode) != want or info.st_uid != lab_home().stat().st_uid:
            found.append(f"{path} {oct(stat.S_IMODE(info.st_mode))}")
    return found


def other_user_reads(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", OTHER_USER, "--", "cat", str(path)], capture_output=True, text=True,
                          cwd="/")


# ---- secrets at rest --------------------------------------------------------------------------------

def test_every_file_of_a_run_is_its_users_alone(run):
    assert not_private(lab_home() / WORKDIR / "runs") == []
    for name in ("run.json", "driver.log", "status.json", "driver-args.json", "code/rpc.py"):
        refused = other_user_reads(run_dir(run) / name)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, name
    listing = subprocess.run(["runuser", "-u", OTHER_USER, "--", "ls", str(lab_home() / WORKDIR / "runs")],
                             capture_output=True, text=True, cwd="/")
    assert listing.returncode != 0


def test_the_job_inherits_umask_077(run, host):
    with connect(host) as remote:
        assert "umask 077" in runs_call(remote, host, "logs", {"run": run, "lines": 1000})["text"]


def test_the_bundle_and_the_cache_are_the_users_alone(run, host):
    with connect(host) as remote:
        bundle = cache() / "bundles" / remote.bundle.digest
    for directory in (cache(), cache() / "calls", cache() / "bundles"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert not_private(bundle) == []
    assert other_user_reads(bundle / "remote" / "entry.py").returncode != 0


def test_cache_directories_an_older_specrig_left_open_are_closed_by_the_next_call(host):
    for directory in (cache(), cache() / "calls", cache() / "bundles"):
        as_lab_user("chmod", "755", str(directory))
    with connect(host) as remote:
        remote.call("probe", {})
    for directory in (cache(), cache() / "calls", cache() / "bundles"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(lab_home().stat().st_mode) == 0o755, "the home is the user's: never changed"


def test_a_call_file_is_created_0600_by_the_command_that_writes_it(host):
    """The call line with an interpreter that does not read the file (/bin/true): the file stays behind, as
    `cat` wrote it, for the test to look at."""
    before = set(os.listdir(cache() / "calls"))
    with connect(host) as remote:
        with pytest.raises(SpecrigError):
            remote.call("probe", {}, python="/bin/true")
    left = [cache() / "calls" / name for name in set(os.listdir(cache() / "calls")) - before]
    try:
        assert left, "the call file was not left behind"
        for path in left:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert SECRET in path.read_text()  # the call's env: hosts.yaml's, which only the user may read
            assert other_user_reads(path).returncode != 0
    finally:
        for path in left:
            as_lab_user("rm", "-f", str(path))


def test_during_a_call_the_calls_directory_is_closed_to_others(host):
    with connect(host) as remote:
        call = threading.Thread(target=remote.call, args=("probe", {"sleep": 3}))
        call.start()
        try:
            time.sleep(1)
            assert stat.S_IMODE((cache() / "calls").stat().st_mode) == 0o700
            listing = subprocess.run(["runuser", "-u", OTHER_USER, "--", "ls", str(cache() / "calls")],
                                     capture_output=True, text=True, cwd="/")
            assert listing.returncode != 0
        finally:
            call.join()


def test_the_job_sees_env_and_the_record_keeps_only_its_names(run, host):
    with connect(host) as remote:
        log = runs_call(remote, host, "logs", {"run": run, "lines": 1000})["text"]
    assert f"env HF_TOKEN sha256={sha(SECRET)}" in log
    record = json.loads((run_dir(run) / "run.json").read_text())
    assert "env" not in record and record["env_keys"] == ["HF_TOKEN", "SPECRIG_TEST_LINES"]


def test_status_logs_and_json_do_not_print_the_secret(run, inventory):
    outputs = [inv("status", "--host", "lab", inventory=inventory),
               inv("status", "--host", "lab", "--run", run, inventory=inventory),
               inv("status", "--host", "lab", "--run", run, "--json", inventory=inventory),
               inv("logs", "--host", "lab", "--run", run, "--raw", inventory=inventory)]
    for result in outputs:
        assert result.returncode == 0, result.stderr
        assert SECRET not in result.stdout + result.stderr


def test_inv_hosts_json_names_env_variables_without_their_values(inventory):
    result = inv("hosts", "--json", inventory=inventory)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout
    assert json.loads(result.stdout)["hosts"]["lab"]["env_keys"] == ["HF_TOKEN", "SPECRIG_TEST_LINES"]


def test_a_bad_env_value_is_named_by_its_type(make_inventory):
    result = inv("hosts", inventory=make_inventory({"hosts": {"h": {"env": {"HF_TOKEN": [SECRET]}}}}))
    assert result.returncode != 0 and "HF_TOKEN" in result.stderr and "got a list" in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_a_remote_error_does_not_quote_the_calls_env(host):
    with connect(host) as remote:
        with pytest.raises(RemoteScriptError) as failed:
            remote.call("probe", {"fail": "boom"})
    assert "boom" in str(failed.value) + (failed.value.detail or "")
    assert SECRET not in str(failed.value) + (failed.value.detail or "")


def test_a_resume_gives_the_job_env_again_and_drops_an_older_records_values(run, host):
    """The run as an older specrig left it: env values in run.json, 0644 files in a 0755 run directory."""
    with connect(host) as remote:
        runs_call(remote, host, "stop", {"run": run}, timeout=120)
        record = json.loads((run_dir(run) / "run.json").read_text())
        record["env"] = {"HF_TOKEN": OLD_SECRET, "SPECRIG_TEST_OLD": OLD_SECRET}
        record.pop("env_keys")
        as_lab_user("tee", str(run_dir(run) / "run.json"), input=json.dumps(record))
        as_lab_user("chmod", "-R", "go+rX", str(lab_home() / WORKDIR / "runs"))
        assert other_user_reads(run_dir(run) / "run.json").returncode == 0  # as it was

        runs_call(remote, host, "resume", {"run": run})
        log = wait_for_log(remote, host, run, "clipboard", count=2)
    second = log[log.rindex("env HF_TOKEN"):]
    assert f"env HF_TOKEN sha256={sha(SECRET)}" in second, "hosts.yaml's value, sent with the resume, wins"
    assert f"env SPECRIG_TEST_OLD sha256={sha(OLD_SECRET)}" in second, "the old record's fills what is missing"
    record = json.loads((run_dir(run) / "run.json").read_text())
    assert "env" not in record and record["env_keys"] == ["HF_TOKEN", "SPECRIG_TEST_OLD"]
    assert OLD_SECRET not in (run_dir(run) / "run.json").read_text()
    assert not_private(lab_home() / WORKDIR / "runs") == []
    assert other_user_reads(run_dir(run) / "run.json").returncode != 0


def test_a_refused_resume_drops_an_older_records_values_too(run, host):
    """The run is active (resumed above): the resume is refused, the record is scrubbed all the same."""
    record = json.loads((run_dir(run) / "run.json").read_text())
    as_lab_user("tee", str(run_dir(run) / "run.json"), input=json.dumps(dict(record, env={"HF_TOKEN": OLD_SECRET})))
    with connect(host) as remote:
        with pytest.raises(SpecrigError, match="nothing to resume"):
            runs_call(remote, host, "resume", {"run": run})
    assert OLD_SECRET not in (run_dir(run) / "run.json").read_text()
    assert json.loads((run_dir(run) / "run.json").read_text())["env_keys"] == record["env_keys"]


# ---- terminal escapes from the host -------------------------------------------------------------------

def on_a_terminal(*args: str, inventory: Path) -> bytes:
    """`inv ARGS` with a pty for its stdin, stdout and stderr: what a terminal would have been sent."""
    master, slave = os.openpty()
    env = {**os.environ, "SPECRIG_HOSTS": str(inventory), "TERM": "xterm-256color", "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(REPO), *args], stdin=slave, stdout=slave,
                            stderr=slave, env=env, cwd=REPO, close_fds=True)
    os.close(slave)
    output = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the pty's other end is closed
            break
        if not data:
            break
        output += data
    os.close(master)
    assert proc.wait(timeout=120) == 0, output.decode(errors="replace")
    return output


def assert_escaped(output: bytes) -> None:
    for attack in (TITLE, CLEAR, CLIPBOARD):
        assert attack.encode() not in output, f"{attack!r} reached the terminal"
    for shown in ("\\x1b]0;pwned\\x07retitled", "\\x1b[2Jcleared", "\\x1b]52;c;cm0gLXJmIH4=\\x07clipboard"):
        assert shown.encode() in output


def test_inv_logs_on_a_terminal_shows_the_sequences_escaped(run, inventory):
    assert_escaped(on_a_terminal("logs", "--host", "lab", "--run", run, inventory=inventory))


def test_inv_status_on_a_terminal_shows_the_log_tail_escaped(run, inventory):
    assert_escaped(on_a_terminal("status", "--host", "lab", "--run", run, inventory=inventory))


def test_inv_logs_raw_gives_the_text_as_it_is(run, inventory):
    result = inv("logs", "--host", "lab", "--run", run, "--raw", inventory=inventory)
    assert result.returncode == 0, result.stderr
    log = (run_dir(run) / "driver.log").read_text()
    for line in ATTACK_LINES:
        assert line + "\n" in result.stdout
    assert result.stdout == "\n".join(log.split("\n")[:-1][-50:]) + "\n"


def test_status_json_holds_the_text_as_it_is(run, inventory):
    result = inv("status", "--host", "lab", "--run", run, "--json", inventory=inventory)
    assert "\x1b" not in result.stdout
    tail = json.loads(result.stdout)["log_tail"]
    for line in ATTACK_LINES:
        assert line in tail


def test_the_live_view_shows_the_tail_escaped(run, host):
    with connect(host) as remote:
        result = runs_call(remote, host, "status", {"run": run, "lines": 8})
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    progress, bar = samples_bar()
    console.print(render(result["runs"][0], result["log_tail"], progress, bar))
    output = console.file.getvalue()
    for attack in (TITLE, CLEAR, CLIPBOARD):
        assert attack not in output
    assert "\\x1b[2Jcleared" in output


# ---- last: the secret is nowhere on the host -------------------------------------------------------------

def test_the_secret_is_in_no_file_on_the_host(run, host):
    with connect(host) as remote:
        runs_call(remote, host, "stop", {"run": run}, timeout=120)
    found = subprocess.run(["grep", "-rlF", "--exclude-dir=venv*", "--exclude-dir=models", SECRET, str(lab_home())],
                           capture_output=True, text=True)
    assert found.stdout == "", f"the token is stored in: {found.stdout}"
    found = subprocess.run(["grep", "-rlF", "--exclude-dir=venv*", "--exclude-dir=models", OLD_SECRET,
                            str(lab_home())], capture_output=True, text=True)
    assert found.stdout == "", f"the old record's token is stored in: {found.stdout}"
