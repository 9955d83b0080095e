"""`inv verify-signatures`: the drift report of a host's environment (specrig/drift/view.py shows it).

The analysis runs on the host (remote/drift/verify.py → remote/drift/analyzer.py); only its JSON
comes back. docs/findings.md documents that JSON and the finding ids.
"""
from __future__ import annotations

from dataclasses import dataclass

from specrig.errors import CouldNotCheck, UsageError
from specrig.exit_status import ExitStatus
from specrig.inventory import Host
from specrig.transport import Remote, connect

VERIFY_TIMEOUT_S = 300

@dataclass(frozen=True)
class Report:
    """One analysis result (docs/findings.md) and where it came from."""

    data: dict
    #: The host name, or a description such as "wheels" for check-compat.
    source: str

    def __post_init__(self):
        if not isinstance(self.data, dict) or "findings" not in self.data:
            raise ValueError(f"not a drift report: {self.data!r:.200}")

    @property
    def findings(self) -> list[dict]:
        return self.data["findings"]

    @property
    def drift(self) -> list[dict]:
        return [f for f in self.findings if f["severity"] == "drift"]

    @property
    def ids(self) -> set[str]:
        return {f["id"] for f in self.drift}

    @property
    def exit_status(self) -> ExitStatus:
        return ExitStatus.FINDINGS if self.drift else ExitStatus.OK


def verify_host(remote: Remote, *, model: str | None = None, storage: str | None = None,
                use_cache: bool = True) -> Report:
    """Run the analysis on a connected host (one call on an open connection: apply-patches reuses it);
    `storage`, a server-mode run's storage type: the points of that storage type are drift, not notes.
    The host answers from its cache in the workdir when nothing the answer depends on changed
    (remote/drift/answers.py); `use_cache` False analyses anyway. The report's "cache" says which."""
    args = {"consumers": ["speculators"], "provider": "vllm", "workdir": remote.host.workdir}
    if not use_cache:
        args["no_cache"] = True
    if model:
        args["model"] = model
    if storage:
        args["storage"] = storage
    if remote.host.two_environments:
        # vLLM lives in the server's environment (speculators >= 0.8): the host reads it from there.
        args["server_python"] = remote.host.server_interpreter
    try:
        data = remote.call("verify", args, timeout=VERIFY_TIMEOUT_S)
    except CouldNotCheck:
        raise
    except UsageError as exc:
        # The one argument of this call a host can find bad is the model; a repo id missing from the
        # host's cache comes with its own fix.
        hint = None if exc.kind == "model-not-found" else (
            f"check --model {model!r}: a model directory on the host holding config.json, or the Hugging Face "
            f"repo id of a model in the host's cache")
        raise CouldNotCheck(exc.message, hint=hint) from None
    return Report(data=data, source=remote.host.name)


def verify(host: Host, *, model: str | None = None, storage: str | None = None, use_cache: bool = True) -> Report:
    """`inv verify-signatures`: one connection, one remote call."""
    with connect(host) as remote:
        return verify_host(remote, model=model, storage=storage, use_cache=use_cache)

