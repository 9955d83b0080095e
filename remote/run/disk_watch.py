"""Free space where a run writes, watched while it runs (issue 17), stdlib only.

A run's sample files go into its output directory; in server mode vLLM's connector first writes each
one into its staging directory, which may be another filesystem (hosts.yaml `staging:`). A disk that
fills under the connector fails its writes one by one: the client skips those samples, and a file cut
short is work lost. So the supervisor (supervisor_loop.py) looks first: when it starts, and at every poll
of an attempt's watch, at each directory's free space against the margin of the files that may be
written before its next look. Below it, the attempt ends as a stop would end it (the server and the
client, or the driver), the whole files are kept, the partial ones are removed, and the run fails as
DISK_LOW, not retried. A resume meets the same look when its supervisor starts: refused in the same
one line until there is room.

The margin, defined here once: the largest sample file written so far (before the first one, the
workload's guess of a file's size, when it has one) times the files that may be in flight at once (or
those left to write, when fewer), never less than FLOOR_BYTES; nothing once no file is left to write (a
run whose last files leave less than the floor has finished, not run low).
"""
import os
import time

from base.units import human_bytes

#: The least free space a run keeps, whatever the size of its files: room for what is written beside
#: them (the run's logs and records where they share the disk, the connector's lock files, directory
#: blocks) and a margin while no file has said yet how large the files are. A model's files in flight
#: ask for more (an 8B model's: 64 MiB each, 64 in flight at the default concurrency).
FLOOR_BYTES = 16 * 2 ** 20
#: Seconds between looks at the sizes of the files written; the free space is looked at every poll.
SIZES_EVERY_S = 5.0
ADVICE = ("free space there, or launch again with a larger --out (and extract.staging where that is another "
          "filesystem); every whole file is kept, and `inv resume` makes the missing ones once there is room")


def free_bytes(path):
    """Bytes of the filesystem holding `path` that this user may still write (root's reserve excluded)."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def margin(file_bytes, files):
    """The free space a run needs before its next `files` files of `file_bytes` each (None: not known
    yet): at least FLOOR_BYTES, and nothing when no file is left to write."""
    return max(FLOOR_BYTES, (file_bytes or 0) * files) if files else 0


def low_line(path, free, need):
    """The one line that says it: the run's failure, and a resume refused."""
    return "disk low: %s free on %s, need about %s" % (human_bytes(free), path, human_bytes(need))


class DiskWatch:
    """The directories a workload writes (`directories`), against the margin of its next files: those
    matching `sample_file` in `out` tell their size, `file_bytes` guesses it before the first one;
    `remaining()` counts the files left to write (None: not known), asked only when the room is short."""

    def __init__(self, *, directories, out, sample_file, file_bytes, in_flight, remaining):
        # The output and the staging directory are one filesystem, or two to look at.
        self.directories = list(dict.fromkeys(directories))
        self.out, self.sample_file = out, sample_file
        self.file_bytes, self.in_flight, self.remaining = file_bytes, in_flight, remaining
        self.largest, self.sized, self.sized_at = 0, set(), None

    def need(self, files=None):
        """The margin now (margin()) of `files` files (None: as many as may be in flight), from the
        largest file so far."""
        now = time.monotonic()
        if self.sized_at is None or now - self.sized_at >= SIZES_EVERY_S:
            self.sized_at = now
            self.measure()
        return margin(self.largest or self.file_bytes, self.in_flight if files is None else min(files,
                                                                                                self.in_flight))

    def measure(self):
        """The largest sample file so far; each file's size is read once (a run's output may hold
        hundreds of thousands: they are listed again, not read again)."""
        if self.sample_file is None:
            return  # a workload without sample files (a training): its guess stands
        try:
            with os.scandir(self.out) as entries:
                for entry in entries:
                    if entry.name in self.sized or not self.sample_file.fullmatch(entry.name):
                        continue
                    try:
                        size = entry.stat().st_size
                    except OSError:
                        continue  # renamed away meanwhile (a rewrite)
                    self.sized.add(entry.name)
                    self.largest = max(self.largest, size)
        except OSError:
            pass  # not made yet

    def low(self):
        """{"path", "free", "need", "line"} of the first directory with less free space than the
        margin, else None."""
        need, left = self.need(), None
        for path in self.directories:
            try:
                free = free_bytes(path)
            except OSError:
                continue  # not made yet: nothing written there either
            if free < need and left is None:
                # Short of room for a full flight of files: fewer may be left (counting them lists the output).
                left = self.remaining()
                need = self.need(left)
            if free < need:
                return {"path": path, "free": free, "need": need, "line": low_line(path, free, need)}
        return None
