"""An installed (non-editable) copy carries remote/ and patchsets/ and runs the same primitive."""
import json
import subprocess
import sys
import venv

from conftest import REPO

PROGRAM = """
import json, sys
from specrig.inventory import Host
from specrig.transport import connect
from specrig.paths import remote_dir, patchsets_dir
with connect(Host(name="local", python=sys.executable)) as remote:
    facts = remote.call("doctor", {})
print(json.dumps({"remote_dir": str(remote_dir()), "patchsets": str(patchsets_dir()), "python": facts["python"]}))
"""


def test_wheel_install_runs_doctor_locally(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, cwd=tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wheels.glob("*.whl")], check=True,
                   capture_output=True)
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    out = subprocess.run([str(python), str(script)], check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    result = json.loads(out)
    assert "site-packages/specrig/_data/remote" in result["remote_dir"]
    assert result["patchsets"].endswith("_data/patchsets")
    assert result["python"]["executable"].startswith(str(env_dir))
