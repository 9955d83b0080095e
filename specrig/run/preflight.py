"""Preflight: the host's checks (remote/run/preflight.py) plus verify-signatures, before a launch."""
from __future__ import annotations

from specrig.drift.verify import verify_host
from specrig.errors import CouldNotCheck
from specrig.inventory import Host
from specrig.run.settings import Request
from specrig.transport import Remote

#: The collective probe may run twice (with the run's env, then with P2P off), each up to 90 s for torch to
#: import and 30 s for the all-reduce (remote/gpus/collective.py).
PREFLIGHT_TIMEOUT_S = 360


def preflight(remote: Remote, host: Host, request: Request) -> list[dict]:
    """The host's checks plus verify-signatures, each {name, ok, detail, advice}."""
    result = remote.call("preflight", {"workdir": host.workdir, "driver_args": request.driver_args,
                                       "server_python": host.server_python},
                         timeout=PREFLIGHT_TIMEOUT_S)
    return [verify_check(remote, host, request.driver_args.get("model"), request.driver_args.get("storage"))] \
        + result["checks"]


def verify_check(remote: Remote, host: Host, model: str | None, storage: str | None = None) -> dict:
    """verify-signatures as a preflight check, for the run's storage type: any finding of severity `drift` fails it."""
    advice = (f"`inv verify-signatures --host {host.name}` lists it; "
              f"`inv apply-patches --host {host.name}` fixes the known drift")
    try:
        report = verify_host(remote, model=model, storage=storage)
    except CouldNotCheck as exc:
        return {"name": "verify-signatures", "ok": False, "detail": f"could not check: {exc.one_line()}",
                "advice": f"`inv doctor --host {host.name}` shows the host's packages"}
    if not report.drift:
        return {"name": "verify-signatures", "ok": True, "advice": None,
                "detail": f"no drift ({len(report.findings)} note(s))"}
    ids = sorted(report.ids)
    return {"name": "verify-signatures", "ok": False, "advice": advice,
            "detail": f"{len(report.drift)} drift finding(s): " + "; ".join(ids[:3]) + (" …" if len(ids) > 3 else "")}
