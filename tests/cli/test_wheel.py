"""The wheel as `pip install specrig` gets it: every package and data file, and the `specrig`
command, installed in a fresh venv and run from directories outside the checkout, on the lab host."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import yaml

from specrig import __version__
from specrig.exit_status import ExitStatus
from support.lab import inv
from support.paths import REPO

#: What a build reads from the checkout (pyproject.toml names README.md as the readme). Copied out
#: first: pip builds a local directory in place, and a stale build/ there could leak deleted files
#: into the wheel (or race another test run building at the same time).
SOURCES = ("pyproject.toml", "README.md", "specrig", "remote", "patchsets")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")


@dataclasses.dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    #: The console script pip wrote from [project.scripts].
    specrig: Path
    python: Path
    #: An empty XDG_CONFIG_HOME, so that the tester's own ~/.config/specrig never takes part.
    config: Path

    def env(self, **extra: str) -> dict:
        """The environment a user's shell would give: no PYTHONPATH (it would leak the checkout's
        code), no SPECRIG_HOSTS unless a test sets it."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECRIG_HOSTS", "XDG_CONFIG_HOME")}
        return {**env, "XDG_CONFIG_HOME": str(self.config), **extra}

    def run(self, *args: str, cwd: Path, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.specrig), *args], capture_output=True, text=True, cwd=cwd,
                              env=self.env(**env), timeout=timeout)


def install_once(tmp_path_factory) -> Installed:
    """Build the wheel and install it into a fresh venv, once per test session (shared with
    test_installed_copy.py through the session's base temp directory)."""
    base = tmp_path_factory.getbasetemp() / "specrig-wheel"
    installed = Installed(wheel=base / "wheels", venv=base / "venv", specrig=base / "venv" / "bin" / "specrig",
                          python=base / "venv" / "bin" / "python", config=base / "xdg-config")
    done = base / "installed"
    if done.exists():
        return dataclasses.replace(installed, wheel=Path(done.read_text()))
    shutil.rmtree(base, ignore_errors=True)
    source = base / "source"
    source.mkdir(parents=True)
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=SKIP)
        else:
            shutil.copy2(REPO / name, source / name)
    env = installed.env()
    # pip builds in an isolated environment with the setuptools pyproject.toml asks for, fetched
    # through the configured index (a local one on these machines): the build a user's pip does.
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(installed.wheel),
                            str(source)], capture_output=True, text=True, cwd=base, env=env)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = installed.wheel.glob("specrig-*.whl")
    # The venv sees this interpreter's packages (fabric, invoke, paramiko, pyyaml, rich are installed
    # here) so that nothing is downloaded; --ignore-installed puts specrig itself into the venv even
    # though the checkout is installed (editable) in the system site-packages, and the venv's own
    # site-packages comes first on its sys.path.
    venv.create(installed.venv, system_site_packages=True, with_pip=False)
    install = subprocess.run([str(installed.python), "-m", "pip", "install", "--no-deps", "--no-index",
                              "--ignore-installed", str(wheel)], capture_output=True, text=True, cwd=base, env=env)
    assert install.returncode == 0, install.stdout + install.stderr
    installed.config.mkdir()
    done.write_text(str(wheel))
    return dataclasses.replace(installed, wheel=wheel)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return install_once(tmp_path_factory)


@pytest.fixture
def lab_inventory(lab, tmp_path):
    """The shipped hosts.yaml in a directory of its own outside the checkout, key paths made
    absolute, with the lab's host key in its project known_hosts (.specrig/known_hosts)."""

    def make(directory: Path) -> Path:
        data = yaml.safe_load((REPO / "hosts.yaml").read_text())
        for entry in data["hosts"].values():
            key = entry.get("identity_file")
            if key and not os.path.isabs(os.path.expanduser(key)):
                entry["identity_file"] = str(REPO / key)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "hosts.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return make


def place_known_hosts(target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / ".specrig" / "known_hosts", target)


def test_wheel_holds_every_package_and_data_file(installed):
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    # Every module but the lab's, which is for a clone (docs/ARCHITECTURE.md, "The lab and the wheel").
    expected = {f"specrig/{p.relative_to(REPO / 'specrig').as_posix()}" for p in (REPO / "specrig").rglob("*.py")
                if "__pycache__" not in p.parts and p.parent.name != "lab"}
    # Every file the checkout's bundle would carry, so that an installed copy sends the same bundle.
    for top in ("remote", "patchsets"):
        expected |= {f"specrig/_data/{top}/{p.relative_to(REPO / top).as_posix()}" for p in (REPO / top).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert expected - names == set()
    # remote/ has subpackages (drift, patching, run and below): the flat glob would miss them.
    for sub in ("drift", "patching", "run"):
        assert f"specrig/_data/remote/{sub}/__init__.py" in names
    assert "specrig/cli/program.py" in names
    assert not [name for name in names if name.startswith("specrig/lab/")]  # the lab is for a clone
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    scripts = zipfile.ZipFile(installed.wheel).read(entry_points).decode()
    assert "specrig = specrig.cli.program:main" in scripts


def test_the_installed_copy_runs_its_own_files(installed, tmp_path):
    # Run from outside the checkout without PYTHONPATH: the venv's specrig, not /work/main's.
    probe = ("import specrig, specrig.paths as p; "
             "print(specrig.__file__); print(p.remote_dir()); print(p.patchsets_dir()); print(p.checkout_dir())")
    out = subprocess.run([str(installed.python), "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env=installed.env(), check=True).stdout.split("\n")
    site = str(installed.venv)
    assert out[0].startswith(site) and "site-packages/specrig/" in out[0]
    assert out[1].startswith(site) and out[1].endswith("site-packages/specrig/_data/remote")
    assert out[2].startswith(site) and out[2].endswith("site-packages/specrig/_data/patchsets")
    assert out[3] == "None"
    assert installed.specrig.read_text().startswith(f"#!{installed.python}")


def test_version_list_and_help_are_invokes(installed, tmp_path):
    version = installed.run("--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"specrig {__version__}"
    listing = installed.run("--list", cwd=tmp_path)
    assert listing.returncode == 0
    # The same tasks and help as `inv` in the checkout; only the header differs (Invoke calls a
    # bundled namespace's tasks "Subcommands").
    # The checkout's `inv` has the lab's tasks too, which no installed copy has (their help may wrap).
    kept, in_lab = [], False
    for line in inv("--list").stdout.split("\n")[1:]:
        if not line.startswith("      "):  # a task's first line (or a blank one) ends the task before
            in_lab = line.startswith("  lab.")
        if not in_lab:
            kept.append(line)
    assert listing.stdout.split("\n")[1:] == kept
    for name in ("doctor", "verify-signatures", "apply-patches", "extract"):
        assert f"  {name} " in listing.stdout
    assert "lab." not in listing.stdout
    assert installed.run("lab.up", cwd=tmp_path).returncode == inv("nosuch-task").returncode != 0
    helped = installed.run("--help", "doctor", cwd=tmp_path)
    assert helped.returncode == 0 and "--host=STRING" in helped.stdout and helped.stdout.startswith("Usage: specrig")
    core = installed.run("--help", cwd=tmp_path)
    assert "--hosts=STRING" in core.stdout
    unknown = installed.run("nosuch-task", cwd=tmp_path)
    assert unknown.returncode == inv("nosuch-task").returncode != 0


def test_doctor_and_verify_from_a_directory_with_its_own_inventory(installed, lab_inventory, tmp_path):
    project = tmp_path / "project"
    inventory = lab_inventory(project)
    place_known_hosts(project / ".specrig" / "known_hosts")
    hosts = installed.run("hosts", "--json", cwd=project)
    assert hosts.returncode == 0, hosts.stderr
    listed = json.loads(hosts.stdout)
    assert listed["file"] == str(inventory)
    assert listed["hosts"]["lab"]["known_hosts"] == str(project / ".specrig" / "known_hosts")
    doctor = installed.run("doctor", "--host", "lab", cwd=project)
    assert doctor.returncode == 0, doctor.stderr
    assert "speculators" in doctor.stdout and "0.3.0" in doctor.stdout and "vllm" in doctor.stdout
    verify = installed.run("verify-signatures", "--host", "lab", cwd=project)
    # 1: the fresh lab's drift; 0: a lab patched by another test.
    assert verify.returncode in (ExitStatus.OK, ExitStatus.FINDINGS), verify.stderr
    assert "speculators 0.3.0" in verify.stdout and "vllm 0.16.0" in verify.stdout
    assert "drift finding" in verify.stdout
    if verify.returncode == ExitStatus.FINDINGS:
        assert "0 drift findings" not in verify.stdout


def test_hosts_flag_from_a_directory_without_inventory(installed, lab_inventory, tmp_path):
    inventory = lab_inventory(tmp_path / "elsewhere")
    place_known_hosts(tmp_path / "elsewhere" / ".specrig" / "known_hosts")
    empty = tmp_path / "empty"
    empty.mkdir()
    doctor = installed.run("--hosts", str(inventory), "doctor", "--host", "lab", cwd=empty)
    assert doctor.returncode == 0, doctor.stderr
    assert "specrig@127.0.0.1:2222" in doctor.stdout
    # --hosts comes first: ahead of SPECRIG_HOSTS and ./hosts.yaml.
    (empty / "hosts.yaml").write_text("hosts: {}\n")
    ahead = installed.run("--hosts", str(inventory), "doctor", "--host", "lab", cwd=empty,
                          SPECRIG_HOSTS=str(empty / "hosts.yaml"))
    assert ahead.returncode == 0, ahead.stderr


def test_inventory_errors_of_the_installed_command(installed, tmp_path):
    missing = tmp_path / "nope.yaml"
    flag = installed.run("--hosts", str(missing), "doctor", "--host", "lab", cwd=tmp_path)
    assert flag.returncode == ExitStatus.USAGE
    assert flag.stderr.strip().count("\n") == 0 and str(missing) in flag.stderr and "--hosts" in flag.stderr
    variable = installed.run("hosts", cwd=tmp_path, SPECRIG_HOSTS=str(missing))
    assert variable.returncode == ExitStatus.USAGE and "SPECRIG_HOSTS" in variable.stderr
    nothing = installed.run("doctor", "--host", "lab", cwd=tmp_path)
    assert nothing.returncode == ExitStatus.USAGE and nothing.stderr.strip().count("\n") == 0
    for place in (tmp_path / "hosts.yaml", installed.config / "specrig" / "hosts.yaml", "--hosts", "SPECRIG_HOSTS"):
        assert str(place) in nothing.stderr


def test_user_level_inventory_keeps_its_known_hosts_beside_it(installed, lab_inventory, tmp_path):
    config = tmp_path / "config"
    lab_inventory(config / "specrig")
    empty = tmp_path / "empty"
    empty.mkdir()
    # HOME too: the lab's key must come from specrig's known_hosts, not from ~/.ssh.
    env = {"XDG_CONFIG_HOME": str(config), "HOME": str(tmp_path / "home")}
    unknown = installed.run("doctor", "--host", "lab", cwd=empty, **env)
    assert unknown.returncode == ExitStatus.HOST_KEY, unknown.stderr
    place_known_hosts(config / "specrig" / "known_hosts")
    known = installed.run("doctor", "--host", "lab", cwd=empty, **env)
    assert known.returncode == 0, known.stderr
    assert not (config / "specrig" / ".specrig").exists()
