"""Issue 38 on the device: the collective probe with NCCL at world size 1 (a one-GPU machine has no peer to
hang with), a stopped rank at world size 2 over gloo beside it, and doctor's "GPU collectives" survey read on
a real GPU host; the raw nvidia-smi outputs kept as fixtures. Needs only torch: no vLLM, no staging.

    python3 benchmarks/gpu/collective_check.py OUT_DIR

Writes OUT_DIR/collective.json ({"probe_nccl", "probe_gloo_stopped", "survey"}) and OUT_DIR/nvidia-smi/
(topo_m.txt, topo_p2p_r.txt, banner.txt, q.txt), and prints the JSON.
"""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "remote"))

# remote/ on the path first, as a call has it.
from gpus import collective, survey

RAW = {"topo_m.txt": ["topo", "-m"], "topo_p2p_r.txt": ["topo", "-p2p", "r"], "banner.txt": [], "q.txt": ["-q"]}


def main() -> int:
    out = Path(sys.argv[1])
    raw = out / "nvidia-smi"
    raw.mkdir(parents=True, exist_ok=True)
    for name, words in RAW.items():
        try:
            done = subprocess.run(["nvidia-smi", *words], capture_output=True, text=True, timeout=60)
            (raw / name).write_text(done.stdout + done.stderr)
        except OSError as exc:  # no nvidia-smi: a trial run on a machine without GPUs
            (raw / name).write_text(str(exc))
    found = {
        "probe_nccl": collective.probe(sys.executable, 1, "nccl"),
        "probe_gloo_stopped": collective.probe(sys.executable, 2, "gloo", timeout_s=10, stop_rank=1),
        "survey": survey.facts(server_python=sys.executable),
    }
    text = json.dumps(found, indent=1, default=str)
    (out / "collective.json").write_text(text)
    print(text)
    return 0 if found["probe_nccl"]["outcome"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
