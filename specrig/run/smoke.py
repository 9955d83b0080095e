"""`inv smoke`: run the extraction driver on a shrunk, randomly weighted copy of the target model.

The host does it (remote/run/smoke.py): the target's own config.json with a few layers and small
dimensions, `load_format: dummy`, a few built-in conversations, through the very driver and code
path `inv extract` uses (server mode, speculators >= 0.8: the same vLLM server and CLI steps, with
`--hf-overrides` and `--load-format dummy`). Every runtime drift (signature, behaviour, platform) shows in about a
minute instead of after a full model load; the failure is named (exception, the speculators
line that raised it, the classifier's kind) and the exit status is FINDINGS. On a Slurm login node the
same call runs as one job on a node (docs/slurm.md). Data only: run/view.py shows it.
"""
from __future__ import annotations

from specrig.doctor import check_extraction_mode
from specrig.errors import Findings, UsageError
from specrig.inventory import Host
from specrig.run.settings import refuse_other_modes, settings_given
from specrig.slurm.submit import refuse_impossible, refuse_nodes, slurm_settings
from specrig.transport import connect

#: Seconds the host gives the driver; the call's own deadline is a little longer.
DRIVER_TIMEOUT_S = 540
#: On a Slurm login node, the job's time in the queue on top (remote/run/smoke.py: SLURM_QUEUE_S).
SLURM_QUEUE_S = 120


#: Server-mode settings the smoke's run takes as `inv extract`'s would (hosts.yaml's extract:, storage also
#: --storage): the server it starts is the one extract would start, only on a shrunk model.
SERVER_SETTINGS = ("storage", "enforce_eager")


def smoke(host: Host, *, model: str | None = None, samples: int = 6, storage: str | None = None) -> dict:
    """The host's smoke result dict, or Findings naming what broke (its payload: the classified failure).
    `storage`: server mode's storage type (else hosts.yaml's extract.storage, else the host's default)."""
    model = model or host.extract.get("model")
    if not model:
        raise UsageError(f"inv smoke: no model for host {host.name!r}",
                         hint=f"pass --model (a directory or a Hugging Face repo id in the host's cache), or set "
                              f"hosts.{host.name}.extract.model in hosts.yaml")
    if samples < 3:
        raise UsageError(f"--samples {samples!r}: give 3 or more (the driver must call generate() twice)")
    settings, sources = settings_given(host, {"storage": storage}, SERVER_SETTINGS)
    slurm = slurm_settings(host)
    if slurm:
        refuse_nodes(host)
    with connect(host) as remote:
        mode = check_extraction_mode(remote, host, "smoke")["mode"]  # speculators 0.5-0.7: exit 2
        refuse_other_modes(settings, sources, mode, host)
        if slurm:
            # The job's call and its output live under ~/.cache/specrig (remote/slurm/jobs.py: run_call).
            refuse_impossible(remote, host, paths=["~/.cache/specrig"])
        try:
            return remote.call("smoke", {"model": model, "samples": samples, "timeout_s": DRIVER_TIMEOUT_S,
                                         "server_python": host.server_python, "host": host.name,
                                         "server_settings": settings, "slurm": slurm},
                               timeout=DRIVER_TIMEOUT_S + 60 + (SLURM_QUEUE_S if slurm else 0))
        except Findings as failed:
            raise Findings(f"{host.name}: smoke failed: {failed.error.get('message')}", payload=failed.payload,
                           hint=failed.hint, detail=failed.payload.get("traceback"), kind=failed.kind,
                           error=failed.error) from None

