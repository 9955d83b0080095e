"""specrig tasks. `inv --list` lists them; `inv --help TASK` shows a task's help.

Thin on purpose: argument handling and one call into the specrig package.
Exit codes: see specrig/exit_status.py and the README.
"""
from invoke import Collection, task

from specrig import lab as lab_host
from specrig.cli import guarded
from specrig.inventory import load_inventory

HOST_HELP = "host name from hosts.yaml, or 'local' for this machine without SSH"
JSON_HELP = "print JSON for scripts instead of tables"


# ---- foundation -------------------------------------------------------------------------------

@task(help={"json": JSON_HELP})
@guarded
def hosts(c, json=False):
    """List the hosts and groups of hosts.yaml."""
    from specrig.views import show_inventory

    show_inventory(load_inventory(), as_json=json)


@task(help={"host": HOST_HELP, "json": JSON_HELP})
@guarded
def doctor(c, host, json=False):
    """Check a host: reachability, login shell, python, speculators/vllm/torch/transformers, GPUs, disk."""
    from specrig.doctor import doctor as run_doctor, show

    target = load_inventory().host(host)
    show(run_doctor(target), as_json=json, host=target)


@task(name="trust-host", help={"host": HOST_HELP, "json": JSON_HELP})
@guarded
def trust_host(c, host, json=False):
    """Show a host's key fingerprint and record it in the project known_hosts (a changed key is refused)."""
    from specrig.trust import trust_host as trust
    from specrig.ui import console, print_json

    result = trust(load_inventory().host(host))
    if json:
        print_json(result)
    elif result["recorded"]:
        console.print(f"recorded {result.get('key_type', '')} {result.get('fingerprint', '')} for {host} "
                      f"in {result['known_hosts']}")
    else:
        console.print(f"{host} is already trusted: {result['key_type']} {result['fingerprint']}")


@task(help={"runnable": "also build the CPU vLLM environment that can run the extraction (~5 min, 8 GB)"})
@guarded
def up(c, runnable=False):
    """Build the lab host on this machine (root): sshd on 127.0.0.1, zsh/bash/dash users, remote venvs."""
    lab_host.up(runnable=runnable)


@task
@guarded
def down(c):
    """Remove everything `inv lab.up` made."""
    lab_host.down()


lab = Collection("lab", up, down)
namespace = Collection(hosts, doctor, trust_host, lab)
