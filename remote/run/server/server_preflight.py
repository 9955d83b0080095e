"""Preflight of a server-mode run (speculators >= 0.8), stdlib only: run/preflight.py calls checks()
when the host's speculators takes server mode.

Beyond the checks both paths share (model, dataset, GPUs, torch's build, the output not in use):
the two environments, the run's plan (the server command can be built: vLLM found, layer ids valid),
a free port, room for the states at the output and at the connector's staging directory, which
should be on the output's filesystem (the client's move is then a rename, not a copy), and flock working
in the staging directory (run/storage.py).
"""
import os
import shutil

from base import contract, outputs, pkgmeta, server_command
from base.units import human_bytes
from run import gpu_preflight, storage
from run.server import plan

#: Files the connector may hold in staging at once, per request in flight (remote/base/contract.py).
STAGING_MARGIN = contract.STAGING_MARGIN


def checks(preflight, driver, *, workdir, server_python, samples, config):
    """The server-mode checks; `preflight` is run/preflight.py (its shared checks and helpers)."""
    found = []
    found.append(environments(preflight, server_python))
    run_plan, plan_check = planned(driver, server_python)
    found.append(plan_check)
    found.append(preflight.gpus(driver.get("tensor_parallel_size")))
    found.append(preflight.torch_arch(driver.get("tensor_parallel_size"),
                                      python=pkgmeta.interpreter(server_python) if server_python else None))
    found += gpu_preflight.checks(driver, server_python, config)  # topology, vLLM on the GPUs, the collective probe
    found.append(plan.port_free(driver.get("port") or contract.SERVER_DEFAULTS["port"]))
    # The disk budget is this host's share, in the run's storage (contract.stored_bytes_per_token).
    share = preflight.share(samples, driver, server=True)
    estimate = preflight.output_estimate(config, dict(driver, layer_ids=run_plan and run_plan["layer_ids"]), share,
                                         storage=driver.get("storage") or contract.SERVER_DEFAULTS["storage"])
    found.append(preflight.disk(driver.get("output_dir"), estimate))
    found.append(staging_disk(preflight, driver, estimate, share))
    if driver.get("output_dir"):
        found.append(storage.locks_check(staging_of(driver)))
    found.append(output_free(preflight, workdir, driver.get("output_dir"),
                             driver.get("storage") or contract.SERVER_DEFAULTS["storage"]))
    return found, estimate


def environments(preflight, server_python):
    """speculators (and its CLI's needs) in `python`; vLLM and torch in the server's environment."""
    client = pkgmeta.versions(("speculators", "transformers", "datasets"))
    try:
        other = pkgmeta.other_environment(server_python, ["vllm", "torch"], server_command.ENVIRONMENT_TIMEOUT_S) \
            if server_python else None
    except pkgmeta.EnvironmentUnreadable as exc:
        return preflight.check("packages", False, "server_python %s: %s" % (server_python, exc),
                               "fix server_python in hosts.yaml (`inv doctor` shows both environments)")
    server = dict((name, (info or {}).get("version")) for name, info in other["installed"].items()) if other \
        else pkgmeta.versions(("vllm", "torch"))
    missing = ["%s (python)" % name for name, version in client.items() if version is None]
    missing += ["%s (%s)" % (name, "server_python" if other else "python") for name, version in server.items()
                if version is None]
    detail = "client: %s; server%s: %s" % (
        ", ".join("%s %s" % item for item in client.items()), " (%s)" % server_python if other else "",
        ", ".join("%s %s" % item for item in server.items()))
    return preflight.check("packages", not missing, detail,
                           "install %s, or point python / server_python in hosts.yaml at the environments that "
                           "have them" % ", ".join(missing))


def planned(driver, server_python):
    """(the plan, or None; its check): the server command and the client steps can be built."""
    try:
        made = plan.make("<run>", "<run-id>", driver, client_python="python", server_python=server_python)
    except plan.PlanError as exc:
        return None, {"name": "server-command", "ok": False, "detail": str(exc),
                      "advice": "fix the value it names (--layers, --model, server_python)"}
    flags = "".join("; passes %s: %s" % (entry["flag"], entry["because"]) for entry in made["startup_flags"])
    return made, {"name": "server-command", "ok": True, "advice": None,
                  "detail": "layers %s of %d (%s); %s storage by %s%s" % (
                      made["layer_ids"], made["num_hidden_layers"], made["layer_convention"], made["storage"],
                      made["connector"], flags)}


def _device(preflight, path):
    return os.stat(preflight.existing_parent(path)).st_dev


def staging_of(driver):
    """The staging directory's parent as the run will have it (the run id comes at launch)."""
    return os.path.expanduser(driver.get("staging") or os.path.join(driver["output_dir"], ".specrig-staging"))


def staging_disk(preflight, driver, estimate, samples):
    """The staging directory: on the output's filesystem (then only in-flight files stay there at once),
    or else with room for every sample too (then each file is copied, and a copy cut short is a
    truncated file: outputs.py finds those)."""
    out = driver.get("output_dir")
    if not out:
        return {"name": "staging", "ok": False, "detail": "no output directory given", "advice": "pass --out"}
    staging = staging_of(driver)
    same = _device(preflight, staging) == _device(preflight, out)
    where = preflight.existing_parent(staging)
    free = shutil.disk_usage(where).free
    largest = max(samples) if samples else 0
    per_token = (estimate or {}).get("bytes_per_token") or 0
    in_flight = (driver.get("concurrency") or contract.SERVER_DEFAULTS["concurrency"]) * STAGING_MARGIN
    need = (estimate or {}).get("bytes", 0) if not same else per_token * largest * in_flight
    detail = "%s: %s the output's filesystem; %s free, needs about %s" % (
        staging, "on" if same else "NOT on", human_bytes(free), human_bytes(need))
    return {"name": "staging", "ok": free >= need, "detail": detail,
            "advice": None if free >= need else "free space at %s, or set extract.staging on the output's "
                                                "filesystem" % where}


def output_free(preflight, workdir, out, storage):
    """No run writes the output; the files already there are kept when valid (checked at the start), and
    are of the run's storage type (those of the other type would be deleted as invalid: a whole dataset)."""
    found = preflight.output_free(workdir, out)
    if found["ok"] and out:
        present = outputs.existing_indices(out)
        if present:
            found["detail"] = "%s (holds %d sample file(s): the valid ones are kept)" % (out, len(present))
            stored = _stored_as(os.path.join(out, outputs.file_name(present[0])))
            if stored not in (None, storage):
                found.update(ok=False, detail="%s holds %d file(s) of %s storage (%s), and the run stores %s: "
                                              "it would delete them as invalid" % (
                                                  out, len(present), stored, outputs.file_name(present[0]), storage),
                             advice="choose another --out, or --storage %s" % stored)
    return found


def _stored_as(path):
    """The storage type of the file at `path`, or None when its header does not read."""
    try:
        return outputs.storage_of(outputs.read_header(path)["tensors"])
    except (outputs.SafetensorsError, OSError):
        return None
