"""Slurm's time and memory formats, read on both sides (the laptop loads this file to check hosts.yaml's
`slurm:`; the host reads sinfo's limits with it). Python 3.9, standard library only."""
import re

#: sinfo's and sbatch's word for no limit.
UNLIMITED = ("infinite", "unlimited", "UNLIMITED")
#: sbatch --time's formats (man sbatch): minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds.
TIME_FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")
#: sbatch --mem: a whole number, in megabytes unless a unit follows.
MEMORY = re.compile(r"^(\d+)([KMGT]?)$")


def seconds(text):
    """A Slurm time as seconds: None for no limit ("infinite", "UNLIMITED"); ValueError when `text` is
    none of TIME_FORMATS. An int is minutes, as sbatch reads a bare number."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str):
        raise ValueError("not a Slurm time: %r" % (text,))
    if text.strip() in UNLIMITED:
        return None
    days = _DAYS.match(text.strip())
    if days:
        day, hours, minutes, secs = (int(part or 0) for part in days.groups())
        return ((day * 24 + hours) * 60 + minutes) * 60 + secs
    clock = _CLOCK.match(text.strip())
    if not clock:
        raise ValueError("not a Slurm time: %r" % (text,))
    parts = [int(part) for part in clock.groups() if part is not None]
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


#: One gres: name[:type][:count], as a request gives it ("gpu:h100:8") or sinfo prints a node's, with its
#: sockets in parentheses ("gpu:h100:8(S:0-1)").
_GRES = re.compile(r"^([a-z][a-z0-9_]*)(?::([A-Za-z0-9_.-]+))?(?::(\d+))?(?:\(.*\))?$")


def gres(text):
    """[(name, type or None, count)] of a gres text, comma-separated ("gpu:h100:8,nic:1"); "(null)" and
    "" are none, a bare name or name:type counts 1 (as sbatch reads --gres=gpu); ValueError on anything
    else."""
    if text in ("(null)", ""):
        return []
    found = []
    for entry in text.split(","):
        match = _GRES.match(entry.strip())
        if not match:
            raise ValueError("not a gres: %r" % (entry,))
        name, kind, count = match.groups()
        if count is None and kind is not None and kind.isdigit():
            kind, count = None, kind  # gpu:8: a count, not a type
        found.append((name, kind, int(count) if count is not None else 1))
    return found
