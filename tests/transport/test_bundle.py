"""The bundle: content-addressed, patchsets shipped as JSON, a broken patchset.yaml one clear line."""
import io
import json
import shutil
import subprocess
import sys
import tarfile
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from specrig.errors import UsageError
from specrig.exit_status import ExitStatus
from specrig.transport import bundle
from specrig.transport.bundle import Bundle, bundle_files
from support.paths import REPO


def test_patchsets_travel_as_json_and_the_digest_follows_the_bytes(tmp_path):
    patchsets = tmp_path / "patchsets"
    (patchsets / "demo").mkdir(parents=True)
    (patchsets / "demo" / "patchset.yaml").write_text("name: demo\npatches: []\n")
    first = Bundle(bundle_files(REPO / "remote", patchsets))
    with tarfile.open(fileobj=io.BytesIO(first.tar_bytes)) as tar:
        assert json.load(tar.extractfile("patchsets/demo/patchset.json")) == {"name": "demo", "patches": []}
        assert tar.extractfile(".complete").read().decode() == first.digest
    assert Bundle(bundle_files(REPO / "remote", patchsets)).digest == first.digest
    (patchsets / "demo" / "patchset.yaml").write_text("name: demo2\npatches: []\n")
    assert Bundle(bundle_files(REPO / "remote", patchsets)).digest != first.digest


def test_broken_patchset_yaml_is_one_line_naming_file_and_line(tmp_path):
    patchsets = tmp_path / "patchsets"
    (patchsets / "broken").mkdir(parents=True)
    (patchsets / "broken" / "patchset.yaml").write_text("name: broken\npatches: [\n")
    with pytest.raises(UsageError) as caught:
        bundle_files(REPO / "remote", patchsets)
    line = caught.value.one_line()
    assert "\n" not in line and "broken/patchset.yaml: not valid YAML at line" in line
    assert "patchsets/README.md" in line


def test_broken_patchset_stops_any_task_with_exit_2_before_reaching_a_host(tmp_path):
    # A copy of the project with one patchset broken: `inv doctor --host local` must refuse cleanly.
    copy = tmp_path / "project"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".lab", "build", "__pycache__", "*.egg-info"))
    (copy / "patchsets" / "speculators-0.3-vllm-0.16-0.17" / "patchset.yaml").write_text("id: [\n")
    result = subprocess.run([sys.executable, "-m", "invoke", "-r", str(copy), "doctor", "--host", "local"],
                            capture_output=True, text=True, cwd=copy, timeout=120)
    assert result.returncode == ExitStatus.USAGE, result.stderr
    assert "not valid YAML" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_hosts_of_a_fleet_task_share_one_build_of_the_bundle(monkeypatch):
    """Every host's thread asks for the bundle at the same moment (after its SSH handshake): one builds
    it, the others wait and get the same one."""
    builds, arrived = [], threading.Barrier(16)

    def counted(remote, patchsets):
        builds.append(threading.get_ident())
        return bundle_files(remote, patchsets)

    def ask(_):
        arrived.wait()
        return bundle.current_bundle()

    bundle._bundle_of.cache_clear()
    monkeypatch.setattr(bundle, "bundle_files", counted)
    with ThreadPoolExecutor(16) as pool:
        shared = list(pool.map(ask, range(16)))
    bundle._bundle_of.cache_clear()
    assert len(builds) == 1 and all(each is shared[0] for each in shared)
