"""An installed (non-editable) copy carries remote/ and patchsets/ and runs the same primitive."""
from __future__ import annotations

import json
import subprocess

from test_wheel import install_once

PROGRAM = """
import json, sys
from specrig.inventory import Host
from specrig.transport import connect
from specrig.paths import remote_dir, patchsets_dir
with connect(Host(name="local", python=sys.executable)) as remote:
    facts = remote.call("doctor", {})
print(json.dumps({"remote_dir": str(remote_dir()), "patchsets": str(patchsets_dir()), "python": facts["python"]}))
"""


def test_wheel_install_runs_doctor_locally(tmp_path_factory, tmp_path):
    # The same wheel and venv as tests/cli/test_wheel.py (built once a session).
    installed = install_once(tmp_path_factory)
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    out = subprocess.run([str(installed.python), str(script)], check=True, capture_output=True, text=True,
                         cwd=tmp_path, env=installed.env()).stdout
    result = json.loads(out)
    assert result["remote_dir"].startswith(str(installed.venv))
    assert "site-packages/specrig/_data/remote" in result["remote_dir"]
    assert result["patchsets"].endswith("_data/patchsets")
    assert result["python"]["executable"].startswith(str(installed.venv))
