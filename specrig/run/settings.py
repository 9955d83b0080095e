"""What `inv extract` takes: one table of settings, mapped to the driver's arguments.

The table is the one definition of each setting's name (on the command line and in hosts.yaml's
`extract:`), its driver argument, its type, the extraction modes it applies to, and its help text;
the task's help is built from it and the defaults come from the host's own (remote/base/contract.py:
the driver's and server mode's).
"""
from __future__ import annotations

import dataclasses

from specrig.contract import DRIVER_DEFAULTS, IN_PROCESS, SERVER, SERVER_DEFAULTS, STORAGES, SUPERVISOR_DEFAULTS
from specrig.errors import UsageError
from specrig.inventory import Host


@dataclasses.dataclass(frozen=True)
class Setting:
    """One `inv extract` setting: its name here and in hosts.yaml, the driver's name, its type, its help."""

    name: str
    driver_key: str
    kind: type
    help: str
    #: What happens without a value, where the host's default (remote/base/contract.py) does not say it.
    fallback: str | None = None
    #: The one extraction mode it applies to (IN_PROCESS: speculators <= 0.4, SERVER: >= 0.8), or None.
    mode: str | None = None
    #: The values it takes, when only some of its kind's are.
    choices: tuple | None = None

    @property
    def task_help(self) -> str:
        """The task's help: what it is, then where its value comes from when not given."""
        fallback = self.fallback if self.fallback is not None else {**DRIVER_DEFAULTS, **SERVER_DEFAULTS}.get(
            self.driver_key)
        return f"{self.help} (default: extract.{self.name}" + (f", else {fallback})" if fallback is not None else ")")


#: What `inv extract` takes and hosts.yaml's `extract:` may hold, mapped to the driver's arguments.
SETTINGS = {s.name: s for s in (
    Setting("model", "model", str, "model directory on the host, or a Hugging Face repo id in its cache"),
    Setting("data", "dataset", str, "dataset on the host: .json/.jsonl conversations, or sharegpt/ultrachat"),
    Setting("out", "output_dir", str, "output directory on the host"),
    Setting("tp", "tensor_parallel_size", int, "tensor-parallel size", "all visible GPUs"),
    Setting("layers", "layer_ids", list, "layer ids to capture, comma-separated, e.g. 2,30,58,60",
            "speculators' choice"),
    Setting("batch_size", "batch_size", int, "samples per generate() call", mode=IN_PROCESS),
    Setting("max_len", "max_length", int, "tokens per sample (server mode: prepare-data's --seq-length)"),
    Setting("max_samples", "max_samples", int, "take at most this many samples", "all"),
    Setting("seed", "seed", int, "dataset shuffle seed"),
    Setting("load_format", "load_format", str, "vLLM load format (dummy: random weights)", "the model's weights"),
    Setting("gpu_memory_utilization", "gpu_memory_utilization", float, "fraction of GPU memory vLLM may take"),
    Setting("collective_safe", "collective_safe", bool, "NCCL_P2P_DISABLE=1 in the job's env and vLLM without its "
            "custom all-reduce (--disable-custom-all-reduce): for GPUs whose P2P over PCIe hangs (ACS redirect, "
            "vLLM #33041); the preflight's collective probe says when it is needed"),
    Setting("port", "port", int, "server mode: the vLLM server's port on the host's 127.0.0.1", mode=SERVER),
    Setting("concurrency", "concurrency", int, "server mode: requests in flight", mode=SERVER),
    Setting("clients", "clients", int, "server mode: generate-offline-data processes sharing the requests "
            "(one's event loop limits a fast GPU: docs/gpu.md)", mode=SERVER),
    Setting("request_timeout", "request_timeout", int, "server mode: seconds per request", mode=SERVER),
    Setting("max_retries", "max_retries", int, "server mode: tries per sample", mode=SERVER),
    Setting("allow_skipped", "allow_skipped", bool,
            "server mode: succeed even when the client skipped samples (they are listed)", mode=SERVER),
    Setting("staging", "staging", str, "server mode: the connector's staging directory, on the output's "
            "filesystem", "<out>/.specrig-staging/<run-id>", mode=SERVER),
    Setting("writer_threads", "writer_threads", int, "server mode: the connector's file-writing threads",
            "the connector's own", mode=SERVER),
    Setting("max_num_batched_tokens", "max_num_batched_tokens", int, "server mode: vLLM's tokens per "
            "scheduler step", "vLLM's own", mode=SERVER),
    Setting("enforce_eager", "enforce_eager", bool, "server mode: vLLM without torch.compile and CUDA graphs "
            "(--enforce-eager): no compiling at each start, as speculators' in-process generator runs it; slower "
            "steps", mode=SERVER),
    Setting("storage", "storage", str, "server mode: how the files hold the hidden states: bf16 (the model's "
            "dtype) or fp8 (hs-connectors' FP8HiddenStatesConnector, about half the bytes; train with "
            "--hidden-states-backend fp8)", mode=SERVER, choices=STORAGES),
    Setting("prepared_cache", "prepared_cache", bool, "server mode: keep prepare-data's output in the workdir's "
            "prepared-cache/, keyed by the dataset's and the tokenizer's hashes and the settings, and skip "
            "prepare-data when a run's key is there (--no-prepared-cache: prepare every time, cache nothing)",
            mode=SERVER),
    Setting("render_server", "render_server", bool, "server mode: prepare-data renders through a GPU-less "
            "`vllm launch render` server while the model loads, instead of through the model's server once it "
            "has loaded (on by default: a first run's /health to last file 0.46 -> 0.83-0.89 of bare prefill on an "
            "H100; --no-render-server turns it off)", mode=SERVER),
)}
#: What each extraction mode is called where a setting is refused.
MODE_NAMES = {IN_PROCESS: "speculators <= 0.4's in-process extraction", SERVER: "server mode (speculators >= 0.8)"}
#: Supervision options hosts.yaml's `extract:` may also hold, typed by their defaults.
OPTIONS = {name: type(default) for name, default in SUPERVISOR_DEFAULTS.items()}
REQUIRED = ("model", "data", "out")


def task_help(*names: str) -> dict[str, str]:
    """Invoke's help= for the task parameters among SETTINGS."""
    return {name: SETTINGS[name].task_help for name in names}


def parse_layers(text: str | list) -> list[int]:
    """`2,30,58,60` (or a YAML list) as a list of layer ids."""
    items = text if isinstance(text, list) else [p for p in str(text).replace(" ", "").split(",") if p]
    try:
        layers = [int(item) for item in items]
    except (TypeError, ValueError):
        raise UsageError(f"--layers {text!r}: give layer ids separated by commas, e.g. 2,30,58,60") from None
    if not layers or any(layer < 0 for layer in layers):
        raise UsageError(f"--layers {text!r}: give non-negative layer ids, e.g. 2,30,58,60")
    return layers


def coerce(setting: Setting, value, where: str):
    """`value` of `setting` as its kind, from `where` (`--port`, `hosts.yaml: ...`); a bad one is a UsageError."""
    coerced = _coerce(setting.name, value, setting.kind, where)
    if setting.choices and coerced not in setting.choices:
        raise UsageError(f"{where} {value!r}: expected one of {', '.join(setting.choices)}")
    return coerced


def refuse_other_mode(setting: Setting, where: str, value, mode: str | None, host: Host) -> None:
    """A UsageError when `setting` (given `value` at `where`) belongs to the other extraction mode than `mode`."""
    if setting.mode and mode and setting.mode != mode:
        raise UsageError(f"{where} {value!r}: {setting.name} applies to {MODE_NAMES[setting.mode]}, and "
                         f"{host.name} takes {MODE_NAMES[mode]}",
                         hint="drop it; `inv extract --help` marks what each mode takes")


def _coerce(name: str, value, kind: type, where: str):
    if kind is list:
        return parse_layers(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"{where} {value!r}: expected true or false")
    try:
        coerced = kind(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where} {value!r}: expected {kind.__name__}") from None
    if kind in (int, float) and (isinstance(value, bool) or coerced <= 0) and name != "seed":
        raise UsageError(f"{where} {value!r}: expected a positive number")
    return coerced


@dataclasses.dataclass(frozen=True)
class Request:
    """A launch: the driver's arguments, the supervisor's options, the env of the job."""

    driver_args: dict
    options: dict
    env: dict
    #: Where each setting came from (`--port`, `hosts.yaml: hosts.h.extract.port`), for messages.
    sources: dict = dataclasses.field(default_factory=dict)

    def for_mode(self, mode: str | None, host: Host) -> Request:
        """This request in the host's extraction mode: a setting of the other mode is refused."""
        refuse_other_modes(self.driver_args, self.sources, mode, host)
        return self


def refuse_other_modes(driver_args: dict, sources: dict, mode: str | None, host: Host) -> None:
    """A UsageError for the first of `driver_args` (from settings_given) that belongs to the other mode than `mode`."""
    for name, where in sources.items():
        refuse_other_mode(SETTINGS[name], where, driver_args[SETTINGS[name].driver_key], mode, host)


def settings_given(host: Host, given: dict, names=tuple(SETTINGS)) -> tuple[dict, dict]:
    """({driver key: value}, {name: where it came from}) of the settings `names`: the command line's value
    (`given`), else hosts.yaml's `extract:`; each coerced, a bad one named in a UsageError."""
    driver_args, sources = {}, {}
    for name in names:
        value, where = given.get(name), f"--{name.replace('_', '-')}"
        if value is None:
            value, where = host.extract.get(name), f"hosts.yaml: hosts.{host.name}.extract.{name}"
        if value is not None:
            driver_args[SETTINGS[name].driver_key] = coerce(SETTINGS[name], value, where)
            sources[name] = where
    return driver_args, sources


def supervisor_options(host: Host) -> dict:
    """The supervision options hosts.yaml's `extract:` sets for the host (max_restarts, stall_timeout_s, ...):
    every supervised run of the host takes them, a training's too."""
    return {name: _coerce(name, host.extract[name], kind, f"hosts.yaml: hosts.{host.name}.extract.{name}")
            for name, kind in OPTIONS.items() if name in host.extract}


def build_request(host: Host, given: dict) -> Request:
    """Command-line values over hosts.yaml's `extract:` defaults; every bad value named."""
    defaults = dict(host.extract)
    unknown = sorted(set(defaults) - set(SETTINGS) - set(OPTIONS))
    if unknown:
        raise UsageError(f"hosts.yaml: hosts.{host.name}.extract.{unknown[0]}: unknown key",
                         hint=f"allowed: {', '.join([*SETTINGS, *OPTIONS])}")
    driver_args, sources = settings_given(host, given)
    options = supervisor_options(host)
    clients, concurrency = driver_args.get("clients"), driver_args.get("concurrency", SERVER_DEFAULTS["concurrency"])
    if clients is not None and clients > concurrency:
        raise UsageError(f"{sources['clients']} {clients!r}: more client processes than requests in flight "
                         f"({concurrency})", hint="give at most --concurrency clients, or raise --concurrency")
    for name in REQUIRED:
        if SETTINGS[name].driver_key not in driver_args:
            raise UsageError(f"no --{name} given and hosts.yaml has no hosts.{host.name}.extract.{name}",
                             hint=f"pass --{name} or add it under `extract:` for {host.name}")
    env = dict(host.env)
    if driver_args.get("collective_safe"):  # the other half of --collective-safe: vLLM's is the driver's argument
        env["NCCL_P2P_DISABLE"] = "1"
    return Request(driver_args=driver_args, options=options, env=env, sources=sources)
