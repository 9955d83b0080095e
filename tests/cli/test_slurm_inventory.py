"""hosts.yaml's `scheduler: slurm` and `slurm:`: every bad value is one line naming the key, the value
and the fix (exit 2, nothing reaches a host); good ones come back with every default filled in."""
import pytest

from specrig.contract import SLURM_SETTINGS
from specrig.exit_status import ExitStatus
from specrig.inventory import load_inventory
from specrig.slurm_settings import formats
from support.inventory import refused_in_one_line
from support.lab import inv


def slurm_host(settings: str, scheduler: str = "slurm") -> str:
    return f"hosts:\n  c:\n    scheduler: {scheduler}\n    slurm: {settings}\n"


# (case, hosts.yaml text, words the one-line error must contain: the key, the value as !r, the fix)
BAD = [
    ("unknown scheduler", "hosts:\n  c:\n    scheduler: pbs\n", ["hosts.c.scheduler", "'pbs'", "use slurm"]),
    ("slurm without scheduler", "hosts:\n  c:\n    slurm: {partition: gpu}\n",
     ["hosts.c.slurm", "None", "add `scheduler: slurm`"]),
    ("slurm not a mapping", slurm_host("[gpu]"), ["hosts.c.slurm", "a mapping", "['gpu']"]),
    ("unknown setting", slurm_host("{partiton: gpu}"), ["hosts.c.slurm.partiton", "unknown key", "allowed: partition"]),
    ("partition spaces", slurm_host("{partition: 'gpu a'}"), ["hosts.c.slurm.partition", "'gpu a'", "as sinfo"]),
    ("partition number", slurm_host("{partition: 7}"), ["hosts.c.slurm.partition", "7"]),
    ("account list", slurm_host("{account: [a]}"), ["hosts.c.slurm.account", "['a']"]),
    ("qos comma", slurm_host("{qos: 'high,low'}"), ["hosts.c.slurm.qos", "'high,low'"]),
    ("gres empty type", slurm_host("{gres: 'gpu::8'}"), ["hosts.c.slurm.gres", "'gpu::8'", "gpu:h100:8"]),
    ("gres sockets", slurm_host("{gres: 'gpu:8(S:0)'}"), ["hosts.c.slurm.gres", "'gpu:8(S:0)'"]),
    ("gres zero", slurm_host("{gres: 'gpu:0'}"), ["hosts.c.slurm.gres", "'gpu:0'"]),
    ("gres int", slurm_host("{gres: 8}"), ["hosts.c.slurm.gres", "8", "name[:type]:count"]),
    ("time words", slurm_host("{time: 2h}"), ["hosts.c.slurm.time", "'2h'", "HH:MM:SS"]),
    ("time zero", slurm_host("{time: 0}"), ["hosts.c.slurm.time", "0", "no time"]),
    ("time list", slurm_host("{time: [1]}"), ["hosts.c.slurm.time", "[1]", "D-HH:MM:SS"]),
    ("nodes zero", slurm_host("{nodes: 0}"), ["hosts.c.slurm.nodes", "from 1", "0"]),
    ("nodes text", slurm_host("{nodes: two}"), ["hosts.c.slurm.nodes", "'two'"]),
    ("nodes bool", slurm_host("{nodes: yes}"), ["hosts.c.slurm.nodes", "True"]),
    ("cpus negative", slurm_host("{cpus_per_task: -4}"), ["hosts.c.slurm.cpus_per_task", "-4"]),
    ("mem unit", slurm_host("{mem: 64GB}"), ["hosts.c.slurm.mem", "'64GB'", "64G"]),
    ("mem bool", slurm_host("{mem: no}"), ["hosts.c.slurm.mem", "False"]),
    ("constraint empty", slurm_host("{constraint: ' '}"), ["hosts.c.slurm.constraint", "' '", "h100"]),
    ("extra not list", slurm_host("{extra_sbatch: --exclusive}"), ["hosts.c.slurm.extra_sbatch", "'--exclusive'"]),
    ("extra short option", slurm_host("{extra_sbatch: ['-N 2']}"), ["hosts.c.slurm.extra_sbatch[0]", "'-N 2'", "--name"]),
    ("extra newline", slurm_host('{extra_sbatch: ["--comment=a\\nb"]}'), ["hosts.c.slurm.extra_sbatch[0]", "\\n"]),
    ("extra owned", slurm_host("{extra_sbatch: ['--exclusive', '--time=10']}"),
     ["hosts.c.slurm.extra_sbatch[1]", "'--time=10'", "use slurm.time"]),
    ("interface", slurm_host("{fabric_interface: 'ib0 eth0'}"), ["hosts.c.slurm.fabric_interface", "'ib0 eth0'", "ib0"]),
    ("interface long", slurm_host("{fabric_interface: abcdefghijklmnop}"),
     ["hosts.c.slurm.fabric_interface", "'abcdefghijklmnop'"]),
    ("defaults checked too", "defaults:\n  slurm: {time: soon}\n", ["defaults.slurm.time", "'soon'"]),
]


@pytest.mark.parametrize("text,words", [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_slurm_setting_is_one_clear_line(make_inventory, text, words):
    refused_in_one_line(make_inventory(text), words)


GOOD = [
    ("minutes", "{time: 90}", {"time": 90}),
    ("days", "{time: '1-12'}", {"time": "1-12"}),
    ("clock", "{time: '04:00:00', nodes: 2, mem: 0}", {"time": "04:00:00", "nodes": 2, "mem": 0}),
    ("typed gres, partitions", "{gres: 'gpu:h100:8,nic:1', partition: 'gpu,gpu-preempt'}",
     {"gres": "gpu:h100:8,nic:1", "partition": "gpu,gpu-preempt"}),
    ("left to the cluster", "{partition: ~}", {"partition": None}),
]


@pytest.mark.parametrize("settings,expected", [case[1:] for case in GOOD], ids=[case[0] for case in GOOD])
def test_good_slurm_settings_come_back_with_defaults(make_inventory, settings, expected):
    host = load_inventory(make_inventory(slurm_host(settings))).host("c")
    assert host.scheduler == "slurm"
    assert host.slurm == {**{name: spec["default"] for name, spec in SLURM_SETTINGS.items()}, **expected}


def test_scheduler_alone_takes_every_default(make_inventory):
    host = load_inventory(make_inventory("hosts:\n  c:\n    scheduler: slurm\n")).host("c")
    assert host.slurm["nodes"] == 1 and host.slurm["extra_sbatch"] == [] and host.slurm["partition"] is None


def test_a_plain_host_has_no_scheduler(make_inventory):
    host = load_inventory(make_inventory("hosts:\n  a: {}\n")).host("a")
    assert host.scheduler is None and host.slurm == {}


def test_shipped_slurm_hosts():
    inventory = load_inventory()
    assert inventory.host("lab-slurm").slurm["partition"] == "gpu"
    example = inventory.host("hopper-login").slurm
    assert all(example[name] not in (None, []) for name in SLURM_SETTINGS)  # the example shows every setting


def test_bad_slurm_setting_exits_2_and_reaches_no_host(make_inventory):
    # An unreachable address: a task that tried to connect would exit 3, not 2.
    path = make_inventory("hosts:\n  c:\n    hostname: 192.0.2.1\n    scheduler: slurm\n    slurm: {gres: 'gpu:0'}\n")
    result = inv("doctor", "--host", "c", inventory=path)
    assert result.returncode == ExitStatus.USAGE
    assert result.stderr.strip().count("\n") == 0 and "hosts.c.slurm.gres" in result.stderr
    assert "'gpu:0'" in result.stderr


# Slurm's time formats (remote/slurm/formats.py): hosts.yaml's `time:` and sinfo's limits alike.
TIMES = [("90", 5400), (90, 5400), ("10:30", 630), ("2:00:00", 7200), ("1-00:00:00", 86400), ("2-12", 216000),
         ("1-02:03", 93780), ("infinite", None), ("UNLIMITED", None)]


@pytest.mark.parametrize("text,seconds", TIMES, ids=[str(case[0]) for case in TIMES])
def test_slurm_times_read_as_seconds(text, seconds):
    assert formats.seconds(text) == seconds


@pytest.mark.parametrize("text", ["2h", "1:2:3:4", "-5", "", True, None, "1-"])
def test_what_is_not_a_slurm_time(text):
    with pytest.raises(ValueError):
        formats.seconds(text)
