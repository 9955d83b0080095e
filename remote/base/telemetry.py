"""GPU telemetry from nvidia-smi's CSV query output (stdlib only).

Parses both `--format=csv` (header with units, values like "29587 MiB") and
`--format=csv,noheader,nounits`. A missing nvidia-smi is a fact, not an error.
"""
import csv
import io
import shutil
import subprocess
import time

#: The fields specrig asks nvidia-smi for, in order, with the key each becomes.
GPU_FIELDS = (
    ("index", "index", int),
    ("name", "name", str),
    ("uuid", "uuid", str),
    ("memory.used", "memory_used_mib", float),
    ("memory.total", "memory_total_mib", float),
    ("memory.free", "memory_free_mib", float),
    ("utilization.gpu", "utilization_pct", float),
    ("temperature.gpu", "temperature_c", float),
    ("power.draw", "power_w", float),
)
APP_FIELDS = (
    ("pid", "pid", int),
    ("process_name", "process_name", str),
    ("gpu_uuid", "gpu_uuid", str),
    ("used_gpu_memory", "memory_used_mib", float),
)
#: The compute capability ("9.0", "10.0"), asked for apart from GPU_FIELDS: nvidia-smi of drivers
#: older than 510 refuses the field, and the whole query with it.
CAP_FIELDS = (
    ("index", "index", int),
    ("uuid", "uuid", str),
    ("name", "name", str),
    ("compute_cap", "compute_cap", str),
)
UNITS = (" MiB", " %", " W", " MHz")
#: The reason given when the host has no nvidia-smi (no NVIDIA GPU, or no driver).
NOT_FOUND = "nvidia-smi not found on PATH"


def _value(text, kind):
    text = text.strip()
    for unit in UNITS:
        if text.endswith(unit):
            text = text[: -len(unit)]
    if text in ("[N/A]", "N/A", "[Not Supported]", ""):
        return None
    return kind(text)


def parse_csv(text, fields, columns=None):
    """Rows of nvidia-smi CSV as dicts keyed by our names; a header row, if present, selects columns.

    Without a header (`noheader`), `columns` names the queried fields in the order they were
    asked for; by default they are `fields` themselves, in order.
    """
    rows = [row for row in csv.reader(io.StringIO(text), skipinitialspace=True) if row]
    if not rows:
        return []
    header = [column.split(" [")[0].strip() for column in rows[0]]
    wanted = [query for query, _, _ in fields]
    if set(wanted) <= set(header):
        positions = [header.index(query) for query in wanted]
        rows = rows[1:]
    elif columns is not None:
        missing = [query for query in wanted if query not in columns]
        if missing:
            raise ValueError("columns %r lack the fields %r" % (list(columns), missing))
        positions = [list(columns).index(query) for query in wanted]
    else:
        positions = list(range(len(fields)))
    parsed = []
    for row in rows:
        parsed.append({key: _value(row[pos], kind) for pos, (_, key, kind) in zip(positions, fields)})
    return parsed


def _query(flag, fields, timeout):
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, NOT_FOUND
    argv = [exe, "%s=%s" % (flag, ",".join(query for query, _, _ in fields)), "--format=csv"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "nvidia-smi did not answer within %d s" % timeout
    if proc.returncode != 0:
        return None, "nvidia-smi failed: %s" % (proc.stderr or proc.stdout).strip()
    return parse_csv(proc.stdout, fields), None


def gpus(timeout=15):
    """{"available": bool, "gpus": [...], "reason": str|None}."""
    rows, reason = _query("--query-gpu", GPU_FIELDS, timeout)
    return {"available": rows is not None, "gpus": rows or [], "reason": reason}


def compute_caps(timeout=15):
    """{"available": bool, "gpus": [{index, uuid, name, compute_cap}], "reason": str|None}.

    Reads no GPU memory and makes no CUDA context: nvidia-smi answers from the driver.
    """
    rows, reason = _query("--query-gpu", CAP_FIELDS, timeout)
    return {"available": rows is not None, "gpus": rows or [], "reason": reason}


def compute_apps(timeout=15):
    """Processes holding GPU memory: [{pid, process_name, gpu_uuid, memory_used_mib}]."""
    rows, _ = _query("--query-compute-apps", APP_FIELDS, timeout)
    return rows or []


def with_processes(gpu_rows, apps):
    """Copies of the GPU rows, each with "processes": the compute apps on that GPU (matched by uuid)."""
    return [dict(gpu, processes=[app for app in apps if app["gpu_uuid"] == gpu["uuid"]]) for gpu in gpu_rows]


def snapshot(timeout=10):
    """{"gpus": {uuid: row}, "apps": [...]}; empty on a host without nvidia-smi."""
    seen = gpus(timeout=timeout)
    if not seen["available"]:
        return {"gpus": {}, "apps": []}
    return {"gpus": {g["uuid"]: g for g in seen["gpus"]}, "apps": compute_apps(timeout=timeout)}


def wait_released(before, pids, timeout_s):
    """Wait until `pids` hold no GPU memory and each GPU's used memory dropped by what they held in `before`.

    {"held": compute apps of `pids` still listed, "gpus": [{index, uuid, used_before_mib,
    held_by_run_mib, used_after_mib, not_released}]}.

    The driver frees a dead process's memory a moment after the process is gone (seen on
    2x H200: nvidia-smi listed no process while 17 GB were still in use), so a single look
    right after the kill can say "clean" too early, or "held" too late.
    """
    ours = {}
    for app in before["apps"]:
        if app["pid"] in pids:
            ours[app["gpu_uuid"]] = ours.get(app["gpu_uuid"], 0) + (app["memory_used_mib"] or 0)
    deadline = time.monotonic() + timeout_s
    while True:
        now = snapshot()
        held = [app for app in now["apps"] if app["pid"] in pids]
        rows = []
        for uuid, row in now["gpus"].items():
            was = (before["gpus"].get(uuid) or row)["memory_used_mib"] or 0
            # Released: at least 90 % of what the run's processes held has left the GPU (others may allocate).
            not_released = ours.get(uuid, 0) > 0 and (row["memory_used_mib"] or 0) > was - 0.9 * ours[uuid]
            rows.append({"index": row["index"], "uuid": uuid, "used_before_mib": was,
                         "held_by_run_mib": ours.get(uuid, 0), "used_after_mib": row["memory_used_mib"],
                         "not_released": not_released})
        if (not held and not any(r["not_released"] for r in rows)) or time.monotonic() > deadline:
            return {"held": held, "gpus": sorted(rows, key=lambda r: r["index"])}
        time.sleep(0.5)


def visible_gpus(gpu_rows, visible):
    """The GPUs CUDA_VISIBLE_DEVICES (None: all) lets the job see, in its order: cuda:0 is the first.

    Entries are nvidia-smi indices, UUIDs or unique UUID prefixes ("GPU-95e8d11f"). As CUDA does, the
    list ends at the first entry that names no GPU, or one named before: "0,7,1" on two GPUs is GPU 0.
    """
    if visible is None:
        return gpu_rows
    shown = []
    for item in visible.split(","):
        item = item.strip()
        if item.isdigit():
            found = [gpu for gpu in gpu_rows if gpu["index"] == int(item)]
        else:
            found = [gpu for gpu in gpu_rows if item and (gpu["uuid"] or "").startswith(item)]
        if len(found) != 1 or found[0] in shown:
            break
        shown.append(found[0])
    return shown
