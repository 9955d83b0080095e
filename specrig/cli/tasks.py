"""specrig's tasks, the one namespace behind `inv` (a checkout's tasks.py) and `specrig`.

`inv --list` / `specrig --list` lists them; `TASK --help` (or `-h`, or `--help TASK`) shows a task's help:
its docstring and its options (specrig.cli.guard.Task says how Invoke was kept from taking --help as a value).
Thin on purpose: argument handling, then a task's data function and its view handed to the runner
(specrig/cli/runner.py), which picks one host's output or a group's summary.
Exit codes: specrig/exit_status.py and the README.
Every module that reaches a host (paramiko) or builds the lab is imported inside the task that
needs it: `--list` and `--help` import neither (tests/cli/test_lazy_imports.py).
"""
from pathlib import Path

from invoke import Collection

from specrig.cli import accept_tasks, train_tasks
from specrig.cli.guard import guarded, task, whole_number
from specrig.cli.runner import run_task
from specrig.errors import UsageError
from specrig.group import DEFAULT_PARALLEL, PARALLEL_VARIABLE
from specrig.inventory import load_inventory
from specrig.paths import checkout_dir
from specrig.run.settings import task_help

HOST_HELP = ("host name from hosts.yaml, or 'local' for this machine without SSH; or several: a group, 'all', "
             f"or a comma list (in parallel, ${PARALLEL_VARIABLE} at once, default {DEFAULT_PARALLEL})")
JSON_HELP = "print JSON for scripts instead of tables"


# ---- foundation -------------------------------------------------------------------------------

@task(help={"json": JSON_HELP})
@guarded
def hosts(c, json=False):
    """List the hosts and groups of hosts.yaml."""
    from specrig.ui.inventory import show_inventory

    show_inventory(load_inventory(), as_json=json)


@task(help={"host": HOST_HELP, "json": JSON_HELP})
@guarded
def doctor(c, host, json=False):
    """Check a host: reachability, login shell, python, speculators/vllm/torch/transformers in each environment, GPUs, disk."""
    from specrig.doctor import doctor as host_doctor
    from specrig.ui.doctor import DOCTOR

    return run_task(host, host_doctor, DOCTOR, as_json=json)


@task(name="trust-host", help={"host": HOST_HELP, "json": JSON_HELP})
@guarded
def trust_host(c, host, json=False):
    """Show a host's key fingerprint and record it in the project known_hosts (a changed key is refused)."""
    from specrig.transport.trust import trust_host as trust
    from specrig.ui.trust import show_trust

    show_trust(trust(load_inventory().host(host)), as_json=json)


@task(help={"runnable": "also build the CPU vLLM environment that can run the extraction (~5 min, 8 GB)",
            "hosts": "also N more lab hosts lab-1 ... lab-N (group lab-fleet): each its own sshd and host key on "
                     "127.0.1.n:2222, sharing the lab's environments; hosts.yaml names 3, .lab/fleet.yaml all N",
            "slurm": "also a Slurm cluster (Debian's slurm-wlm): slurmctld and two slurmd nodes on this machine, the "
                     "lab's sshd its login node (host lab-slurm; docs/slurm.md)"})
@guarded
def up(c, runnable=False, hosts=None, slurm=False):
    """Build the lab host on this machine (root): sshd on 127.0.0.1, zsh/bash/dash users, remote venvs."""
    from specrig import lab as lab_host

    lab_host.up(runnable=runnable, hosts=whole_number(hosts, option="--hosts", default=0), slurm=slurm)


@task
@guarded
def down(c):
    """Remove everything `inv lab.up` made."""
    from specrig import lab as lab_host

    lab_host.down()


namespace = Collection(hosts, doctor, trust_host)
if checkout_dir() is not None:
    # The lab builds a host from a clone's hosts.yaml and lock files: it ships in no wheel
    # (docs/ARCHITECTURE.md, "The lab and the wheel"); an editable install is a clone.
    namespace.add_collection(Collection("lab", up, down))


# ---- extract: supervised runs (issue 6) -------------------------------------------------------
RUN_HELP = ("run id, or a sharded run's or multi-node job's id: each host's run of it (default: the newest run; "
            "`inv status --host H` lists them)")


NODE_OPTIONS = {
    "nodes": "one multi-node job over the group's hosts instead of a sharded run: dp (data parallel over the nodes) "
             "or tp-pp (tensor x pipeline parallel); the first host is the head and gives the settings "
             "(docs/runs.md, 'Multi-node'; server mode only)",
    "pp": "--nodes tp-pp: pipeline-parallel size (default: the number of nodes)",
    "dp_local": "--nodes dp: data-parallel engines per node (default 1)",
    "rendezvous_port": "--nodes: the head's rendezvous port (default: vLLM's, 29550 for dp, 29501 for tp-pp)",
    "watch_port": "--nodes: node k's supervisor answers the others on this port + k (default 29650)",
}


@task(help={"host": HOST_HELP + "; several hosts split the dataset, one shard each (docs/runs.md, 'Sharded runs')",
            **task_help("model", "data", "out", "tp", "layers", "batch_size", "max_len", "max_samples", "port",
                        "concurrency", "clients", "allow_skipped", "staging", "writer_threads",
                        "max_num_batched_tokens", "enforce_eager", "storage", "prepared_cache",
                        "render_server", "collective_safe"),
            **NODE_OPTIONS,
            "shared_out": "several hosts, server mode: every shard writes one --out on storage they all mount "
                          "(the preflight proves it is one)",
            "array": "on a Slurm login node: N shards as one job array, task k shard k, output <out>/task-<k> "
                     "(docs/slurm.md)",
            "skip_preflight": "launch without the preflight checks (drift, GPUs, model, disk, batch hazard)",
            "detach": "launch and return at once instead of showing the live view",
            "dry_run": "reach nothing: the weights, KV cache and staging per GPU from the model's config.json on "
                       "this machine and hosts.yaml's gpus and gpu_memory_mib, and the settings specrig would "
                       "choose (server mode)",
            "json": JSON_HELP})
@guarded
def extract(c, host, model=None, data=None, out=None, tp=None, layers=None, batch_size=None, max_len=None,
            max_samples=None, port=None, concurrency=None, clients=None, allow_skipped=False, staging=None,
            writer_threads=None, max_num_batched_tokens=None, enforce_eager=False, storage=None, prepared_cache=True,
            render_server=True, collective_safe=False, nodes=None, pp=None,
            dp_local=None, rendezvous_port=None, watch_port=None, shared_out=False, array=None, skip_preflight=False,
            detach=False, dry_run=False, json=False):
    """Preflight, launch the supervised extraction on a host, and show it live (Ctrl-C detaches; the run goes on).

    The host's speculators picks the mode: <= 0.4 drives vLLM in-process; >= 0.8 runs a vLLM server and
    speculators' prepare-data and generate-offline-data (server mode, docs/server-mode.md).

    On several hosts (a group, a list): one sharded run, the dataset split by global sample index
    (in-process: host k of n takes i % n == k; server mode: speculators' own --world-size/--rank chunks);
    every host's preflight first, nothing launched unless all pass; `{host}` in --out is each host's
    name. `inv gather` checks the union.

    With --nodes: one job over the group's hosts, for a target larger than one host: vLLM spans the nodes
    (data parallel, or tensor x pipeline parallel), specrig starts the head then the workers and follows
    them as one; `inv stop --host GROUP --run JOB` ends every node."""
    from specrig.cli import extract as extraction
    from specrig.group import group_hosts
    from specrig.run.node_runs import MODES

    inventory = load_inventory()
    targets = group_hosts(inventory, host)
    given = {"model": model, "data": data, "out": out, "tp": tp, "layers": layers, "batch_size": batch_size,
             "max_len": max_len, "max_samples": max_samples, "port": port, "concurrency": concurrency,
             "clients": clients, "allow_skipped": allow_skipped or None, "staging": staging,
             "writer_threads": writer_threads, "max_num_batched_tokens": max_num_batched_tokens,
             "enforce_eager": enforce_eager or None, "storage": storage,
             # --no-prepared-cache turns it off; without it, hosts.yaml's extract.prepared_cache decides.
             "prepared_cache": None if prepared_cache else False,
             # --no-render-server turns it off; without it, hosts.yaml's extract.render_server decides.
             "render_server": None if render_server else False,
             "collective_safe": collective_safe or None}
    sizes = {"pp": whole_number(pp, option="--pp", default=None),
             "dp_local": whole_number(dp_local, option="--dp-local", default=None),
             "rendezvous_port": whole_number(rendezvous_port, option="--rendezvous-port", default=None),
             "watch_port": whole_number(watch_port, option="--watch-port", default=None)}
    attach = not (detach or json)
    if dry_run:
        return extraction.extract_dry_run(inventory.host(host), given, as_json=json)
    if nodes is not None:
        if nodes not in MODES:
            raise UsageError(f"--nodes {nodes!r}: one of {', '.join(MODES)}")
        return extraction.extract_job(host, targets or [inventory.host(host)], given, mode=nodes, sizes=sizes,
                                      skip_preflight=skip_preflight, attach=attach, as_json=json)
    given_alone = [name for name, value in sizes.items() if value is not None]
    if given_alone:
        raise UsageError(f"--{given_alone[0].replace('_', '-')} applies to a multi-node job",
                         hint="add --nodes dp or --nodes tp-pp (docs/runs.md, 'Multi-node')")
    if array is not None:
        if targets:
            raise UsageError(f"--array {array!r} on a group: a job array is one Slurm login node's",
                             hint="pass one host with `scheduler: slurm` (docs/slurm.md)")
        return extraction.extract_array(inventory.host(host), given, tasks=whole_number(array, option="--array", default=None),
                                        skip_preflight=skip_preflight, as_json=json)
    if targets and len(targets) > 1:
        return extraction.extract_sharded(host, targets, given, shared_out=shared_out, skip_preflight=skip_preflight,
                                          attach=attach, as_json=json)
    if shared_out:
        raise UsageError(f"--shared-out: {host!r} is one host; one shared directory is for the shards of several",
                         hint="name a group or a comma list in --host, or drop --shared-out")
    return extraction.extract_on_host(targets[0] if targets else inventory.host(host), given,
                                      skip_preflight=skip_preflight, attach=attach, as_json=json)


@task(help={"host": HOST_HELP, "run": "run id, or a sharded run's or multi-node job's id (default: every run)",
            "json": JSON_HELP})
@guarded
def status(c, host, run=None, json=False):
    """Runs on a host: state, progress, attempts and classified failures, GPUs; on many, the samples' total."""
    from specrig.run import runs
    from specrig.run.view import STATUS

    return run_task(host, lambda target: runs.status(target, run), STATUS, as_json=json)


@task(help={"host": HOST_HELP, "run": RUN_HELP, "follow": "keep printing new lines until the run ends (Ctrl-C stops)",
            "n": "how many of the last lines to print (default 50)",
            "server": "server mode: the vLLM server's log instead of the client steps'",
            "raw": "the log's text as it is, control characters included (on a terminal they are shown escaped: \\x1b)"})
@guarded
def logs(c, host, run=None, follow=False, n=None, server=False, raw=False):
    """A run's log, every attempt with the supervisor's markers: the driver's, or in server mode speculators'
    CLI steps' (--server: the vLLM server's). Several hosts' lines are prefixed with the host."""
    from specrig.run import runs
    from specrig.run.view import LOGS, RAW_LOGS, write_log
    from specrig.ui.group import PrefixedLines

    lines = runs.log_lines(whole_number(n, option="-n", default=50))
    log = "server" if server else "driver"

    def host_log(target):
        return runs.logs(target, run, follow=follow, lines=lines, log=log)

    def prefixed_logs(targets):
        prefixed = PrefixedLines([target.name for target in targets], raw=raw)

        def prefixed_log(target):
            with prefixed.writer(target.name) as write:
                return write_log(host_log(target), write)

        return prefixed_log

    return run_task(host, host_log, RAW_LOGS if raw else LOGS, as_json=False, group_work=prefixed_logs,
                    detach_note="stopped following; the runs go on" if follow else None)


@task(help={"host": HOST_HELP, "run": "run id, or a sharded run's or multi-node job's id (default: the newest "
                                      "active run)", "json": JSON_HELP})
@guarded
def stop(c, host, run=None, json=False):
    """Stop a run: SIGTERM to its whole process group, a grace period, SIGKILL; report anything left."""
    from specrig.run import runs
    from specrig.run.view import STOP

    return run_task(host, lambda target: runs.stop(target, run), STOP, as_json=json)


@task(help={"host": HOST_HELP, "run": RUN_HELP, "detach": "return at once instead of showing the live view",
            "json": JSON_HELP})
@guarded
def resume(c, host, run=None, detach=False, json=False):
    """Restart a failed, stopped or lost run; the driver continues from the first missing sample."""
    from specrig.group import group_hosts
    from specrig.run import live, runs
    from specrig.run.sharded_runs import JOB_PREFIX, is_group_run_id
    from specrig.run.view import resume_view

    attach = not (detach or json)
    if run and run.startswith(JOB_PREFIX) and group_hosts(load_inventory(), host) is None:
        # A worker alone would wait for a head that is not coming back; the head alone for its workers.
        raise UsageError(f"--run {run!r} is a multi-node job: it resumes on every node at once",
                         hint="pass its group: `inv resume --host GROUP --run JOB`")
    board = live.RunsBoard() if attach else None

    def resume_in_group(target):
        # The whole sharded run (or multi-node job): hosts whose run succeeded or still runs are left as they are.
        return runs.resume(target, run, whole_run=is_group_run_id(run),
                           on_update=(lambda state: board.update(target.name, state)) if board else None)

    return run_task(host, lambda target: runs.resume(target, run), resume_view(live.follow if attach else None),
                    as_json=json, group_work=lambda targets: resume_in_group, board=board,
                    detach_note=f"detached; the runs go on. `inv status --host {host}` shows them, "
                                f"`inv stop --host {host}` stops them." if attach else None)


@task(help={"host": HOST_HELP, "run": "the sharded run's id `inv extract` printed (or a run id)", "json": JSON_HELP})
@guarded
def gather(c, host, run, json=False):
    """Check a sharded run's shards: every sample index exactly once, every file loading whole on its host.

    Each host lists its shard's outputs and loads them (exit 1 names the missing, duplicated or
    unloadable indices)."""
    from specrig.cli.extract import gather as gather_shards
    from specrig.group import select_hosts

    return gather_shards(select_hosts(load_inventory(), host), run, as_json=json)


for _task in (extract, status, logs, stop, resume, gather):
    namespace.add_task(_task)


# ---- verify-dataset: an output checked as the trainer will read it (issue 28) -------------------

def layer_ids_option(value: str | None) -> list[int] | None:
    """--target-layer-ids: whole numbers, comma- or space-separated (None: the files' own)."""
    if value is None:
        return None
    words = value.replace(",", " ").split()
    if not words or not all(word.isdigit() for word in words):
        raise UsageError(f"--target-layer-ids {value!r}: give layer ids as whole numbers, e.g. 2,4,5")
    return [int(word) for word in words]


@task(name="verify-dataset",
      help={"host": HOST_HELP + "; a group: a sharded run's hosts, each checking its shard",
            "run": "run id, or a sharded run's or Slurm job array's id (default: the newest run)",
            "out": "an output directory on the host instead of a run (several, comma-separated: the shards of one "
                   "dataset)",
            "data": "server mode, with --out: prepare-data's output (the rows), when no run of the host wrote --out",
            "full": "load every row with the trainer's code (default: headers and token ids of all, a sample loaded)",
            "hidden_states_backend": "the training's --hidden-states-backend (file, fp8): refused when the files "
                                     "need the other",
            "target_layer_ids": "the training's --target-layer-ids (e.g. 2,4,5): refused unless the files hold them",
            "json": JSON_HELP})
@guarded
def verify_dataset(c, host, run=None, out=None, data=None, full=False, hidden_states_backend=None,
                   target_layer_ids=None, json=False):
    """Prove an extraction output trainable by the host's speculators before the training: every row's file,
    whole, finite, its token ids the row's, the plan's layers; the trainer's own loading code over the rows;
    then the training command that fits, printed and written beside the output (exit 1: not trainable)."""
    from specrig.dataset import verify, view
    from specrig.group import group_hosts

    if run is not None and out is not None:
        raise UsageError("--run and --out name the output twice", hint="give one of them")
    options = {"run": run, "outs": [part for part in out.split(",") if part] if out else None, "data": data,
               "full": full, "backend": hidden_states_backend,
               "target_layer_ids": layer_ids_option(target_layer_ids)}
    hosts = group_hosts(load_inventory(), host)
    if hosts is None:
        return run_task(host, lambda target: verify.verify(target, **options), view.DATASET, as_json=json)
    shards, found = verify.verify_group(hosts, **options)
    return view.show_group(run, shards, found, as_json=json)


namespace.add_task(verify_dataset)
namespace.add_task(train_tasks.train)  # inv train and inv accept: modules of their own
namespace.add_task(accept_tasks.accept)


# ---- smoke: the extraction on a shrunk model with dummy weights (issue 5) ---------------------

@task(name="smoke", help={"host": HOST_HELP,
                          "model": "model directory on the host, or a Hugging Face repo id in the host's cache "
                                   "(default: hosts.yaml extract.model)",
                          "samples": "conversations to extract, at least 3 (default 6: three generate() calls)",
                          **task_help("storage"), "json": JSON_HELP})
@guarded
def smoke_task(c, host, model=None, samples=None, storage=None, json=False):
    """Run the extraction driver on the target's config shrunk (few layers, small dims, dummy weights): drift in a minute."""
    from specrig.run.smoke import smoke
    from specrig.run.view import SMOKE

    count = whole_number(samples, option="--samples", default=6)
    return run_task(host, lambda target: smoke(target, model=model, samples=count, storage=storage), SMOKE,
                    as_json=json)


namespace.add_task(smoke_task)


# ---- drift: verify-signatures, check-compat (issue 3) -------------------------------------------

STORAGE_CHECK_HELP = ("server mode: check for runs of this storage type (bf16, fp8): its points are drift, not notes "
                      "(docs/server-mode.md, 'fp8 storage')")


def storage_option(value: str | None) -> str | None:
    """--storage of the drift tasks, checked as `inv extract` checks it."""
    from specrig.run.settings import SETTINGS, coerce

    return None if value is None else coerce(SETTINGS["storage"], value, "--storage")


@task(name="verify-signatures",
      help={"host": HOST_HELP,
            "model": "model directory on the host, or a Hugging Face repo id in the host's cache: also check its "
                     "class and custom code",
            "storage": STORAGE_CHECK_HELP,
            "json": JSON_HELP, "show_source": "print the provider's source lines each finding points at",
            "no_cache": "analyse even when the host kept an answer for the same code, packages and model "
                        "(its cache in the workdir; --json's `cache` says whether the answer came from it)"})
@guarded
def verify_signatures(c, host, model=None, json=False, show_source=False, storage=None, no_cache=False):
    """Find where the host's speculators drifted from its vLLM, statically (exit 1: drift, 2: could not check)."""
    from specrig.drift.verify import verify
    from specrig.drift.view import verify_view

    storage = storage_option(storage)
    return run_task(host, lambda target: verify(target, model=model, storage=storage, use_cache=not no_cache),
                    verify_view(show_source=show_source), as_json=json)


@task(name="check-compat",
      help={"speculators": "speculators version(s); with --matrix a comma-separated list",
            "vllm": "vLLM version(s); with --matrix a comma-separated list",
            "model_config": "a model's config.json: also check its class and custom code",
            "matrix": "a table of drift counts over every speculators x vLLM pair",
            "storage": STORAGE_CHECK_HELP,
            "json": JSON_HELP, "show_source": "print the provider's source lines each finding points at"})
@guarded
def check_compat(c, speculators, vllm, model_config=None, matrix=False, json=False, show_source=False,
                 storage=None):
    """Drift between released wheels (downloaded once, .py only), no host (exit 1: drift, 2: could not check)."""
    from specrig.drift import compat
    from specrig.drift.view import show, show_matrix

    storage = storage_option(storage)
    if matrix:
        result = compat.matrix(compat.split_versions(speculators, "speculators"), compat.split_versions(vllm, "vllm"),
                               model_config=model_config, storage=storage)
        show_matrix(result, as_json=json)
        return 1 if any(n for row in result["cells"].values() for n in row.values()) else 0
    report = compat.check_compat(speculators, vllm, model_config=model_config, storage=storage)
    show(report, as_json=json, show_source=show_source)
    return report.exit_status


@task(name="compat-report",
      help={"speculators": "speculators versions, comma-separated (default: every release from "
                           "0.3.0 on, from the package index)",
            "vllm": "vLLM versions, comma-separated (default: every release from 0.11.0 on)",
            "out": "the directory the two pages are written to (default: the checkout's docs/, else .)",
            "json": "print the matrix's data for scripts instead of the summary"})
@guarded
def compat_report(c, speculators=None, vllm=None, out=None, json=False):
    """Build docs/compatibility.md and .html: every speculators x vLLM release pair, in both extraction modes.

    Each cell says: works as is, works with a patchset (named), works with a launch flag (named), breaks (the
    first finding), or no extraction mode; it opens to its findings. Each pair's analysis is check-compat's,
    cached under ~/.cache/specrig/compat/ by the wheels' and the analyzer's hashes: a refresh after a new
    release analyzes only that release's pairs. Exit 0 once the pages are written (2: bad input, a release
    the index or a download cannot give)."""
    from specrig.drift import compat_matrix
    from specrig.drift.compat_page import write_pages
    from specrig.drift.view import compat_report_progress, show_compat_report

    target = Path(out) if out else (checkout_dir() / "docs" if checkout_dir() else Path.cwd())
    if not target.is_dir():
        raise UsageError(f"--out {str(target)!r} is not a directory", hint="give an existing directory, e.g. docs")
    spec_versions = compat_matrix.pick_versions("speculators", speculators, since=compat_matrix.SPECULATORS_SINCE)
    vllm_versions = compat_matrix.pick_versions("vllm", vllm, since=compat_matrix.VLLM_SINCE)
    with compat_report_progress(total=len(spec_versions) * len(vllm_versions), as_json=json) as on_cell:
        matrix = compat_matrix.build(spec_versions, vllm_versions, on_cell=on_cell)
    show_compat_report(matrix, pages=write_pages(matrix, out=target), as_json=json)


namespace.add_task(verify_signatures)
namespace.add_task(check_compat)
namespace.add_task(compat_report)


# ---- patches: apply-patches, patch-status, revert-patches (issue 4) --------------------------

PATCHSET_HELP = "patchset name (a folder of patchsets/); default: the one whose ranges match the host's versions"


def _patch_task(title: str, host: str, *, as_json: bool, **options) -> int:
    """apply-patches, patch-status, revert-patches: the host's patches, asked of its engine."""
    from specrig.patching import patches
    from specrig.patching.view import patches_view

    function = {"apply-patches": patches.apply_patches, "patch-status": patches.patch_status,
                "revert-patches": patches.revert_patches}[title]
    return run_task(host, lambda target: function(target, **options), patches_view(title), as_json=as_json)


@task(name="apply-patches", help={
    "host": HOST_HELP, "patchset": PATCHSET_HELP, "json": JSON_HELP,
    "dry_run": "print the unified diffs and change nothing",
    "model": "model directory or Hugging Face repo id on the host for the verification (default: the host's "
             "extract.model)"})
@guarded
def apply_patches(c, host, patchset=None, dry_run=False, model=None, json=False):
    """Apply the patchset matching the host's speculators/vLLM, then verify the drift it fixes is gone."""
    return _patch_task("apply-patches", host, as_json=json, patchset=patchset, dry_run=dry_run, model=model)


@task(name="patch-status", help={"host": HOST_HELP, "patchset": PATCHSET_HELP, "json": JSON_HELP})
@guarded
def patch_status(c, host, patchset=None, json=False):
    """Each patch's state on the host: pending, applied, not-applicable, conflict, or missing (file replaced)."""
    return _patch_task("patch-status", host, as_json=json, patchset=patchset)


@task(name="revert-patches", help={
    "host": HOST_HELP, "json": JSON_HELP, "patch": "revert only this patch id (default: all)",
    "force": "revert even files changed since specrig patched them (their changes are lost)"})
@guarded
def revert_patches(c, host, patch=None, force=False, json=False):
    """Restore the original bytes of the files specrig patched (refused if a file changed since, unless --force)."""
    return _patch_task("revert-patches", host, as_json=json, patch=patch, force=force)


namespace.add_task(apply_patches)
namespace.add_task(patch_status)
namespace.add_task(revert_patches)
