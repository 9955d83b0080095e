"""The `specrig` command, for people who `pip install specrig` or `pipx install specrig`.

Invoke's Program over the very namespace `inv` runs in a checkout (specrig.cli.tasks), so the tasks,
their help and their exit codes are the same (tasks raise invoke.Exit with specrig/exit_status.py
codes through specrig.cli.guard; Program.run turns it into the process's exit status, as under
`inv`). One global flag more than `inv` has, given before the task:

    specrig --hosts FILE doctor --host lab

It names the inventory ahead of $SPECRIG_HOSTS, ./hosts.yaml and ~/.config/specrig/hosts.yaml
(specrig.inventory.locate has the order).
"""
from __future__ import annotations

from invoke import Argument, Program

from specrig import __version__, inventory
from specrig.cli.tasks import namespace

HOSTS_HELP = "inventory file (default: $SPECRIG_HOSTS, else ./hosts.yaml, else ~/.config/specrig/hosts.yaml)"


class SpecrigProgram(Program):
    """Invoke's Program with `--hosts FILE`."""

    def core_args(self) -> list[Argument]:
        # No short name: -H would read as Fabric's --hosts, which is a list of hosts, not a file.
        return [*super().core_args(), Argument(names=("hosts",), help=HOSTS_HELP)]

    def parse_core(self, argv: list[str] | None) -> None:
        super().parse_core(argv)
        # Core flags are parsed before any task runs, and every task finds its inventory through
        # load_inventory(): setting it here reaches them all.
        inventory.use_hosts_file(self.args.hosts.value)


program = SpecrigProgram(namespace=namespace, version=__version__, name="specrig", binary="specrig",
                         binary_names=["specrig"])


def main() -> None:
    """The console script ([project.scripts] in pyproject.toml); exits with the task's status."""
    program.run()
