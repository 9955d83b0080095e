"""The output directory: data_{i}.pt samples, the lock, the resume scan, the background writer.

A sample is written to a hidden temporary name and renamed into place, so a sample's name only
ever holds a whole sample. A write that fails for want of space raises DiskFull with the figures.
"""
import errno
import os
import threading

from base.units import human_bytes
from run.disk_watch import free_bytes
from run.driver.arguments import Locked

SAMPLE_PREFIX, SAMPLE_SUFFIX = "data_", ".pt"
#: What a saved sample takes beyond its tensors' bytes: torch.save's zip headers, the pickle and
#: the 64-byte alignment of each record (3 KiB for the tiny model's), plus a filesystem block.
SAMPLE_OVERHEAD = 16 * 1024


class DiskFull(Exception):
    """A sample write failed and the output directory's filesystem has no room for a sample."""


def sample_name(index):
    return "%s%d%s" % (SAMPLE_PREFIX, index, SAMPLE_SUFFIX)


class OutputDir:
    """data_{i}.pt files, their bounded background writer, the lock, and resume."""

    def __init__(self, path, writes_in_flight):
        import concurrent.futures

        import torch

        if hasattr(torch.serialization, "set_crc32_options"):
            # CRC32 of every record caps torch.save near 300 MiB/s (one core); torch.load does not
            # check it, and the resume check loads every sample anyway.
            torch.serialization.set_crc32_options(False)

        self.path = path
        os.makedirs(path, exist_ok=True)
        self.lock_handle = None
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=writes_in_flight,
                                                          thread_name_prefix="sample-writer")
        self.slots = threading.BoundedSemaphore(writes_in_flight)
        self.errors = []

    def lock(self):
        import fcntl

        self.lock_handle = open(os.path.join(self.path, ".specrig-driver.lock"), "w")
        try:
            fcntl.flock(self.lock_handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise Locked("output_dir=%r is being written by another driver" % self.path) from None

    def first_missing(self, indices, layers):
        """Position in `indices` (global sample indices, in order: all of them, or one shard's) of
        the first sample that is absent or fails to load with the right shapes; len(indices) if none."""
        for position, index in enumerate(indices):
            if not self.loads(index, layers):
                return position
        return len(indices)

    def loads(self, index, layers):
        path = os.path.join(self.path, sample_name(index))
        if not os.path.exists(path):
            return False
        try:
            return sample_is_whole(load_sample(path), layers)
        except Exception:  # any failure to load means: extract it again
            return False

    def submit(self, index, sample, on_written):
        """Write in the background; blocks while writes_in_flight writes are pending."""
        if self.errors:
            self.drain()
        self.slots.acquire()
        future = self.pool.submit(self._write, index, sample)

        def finished(done):
            self.slots.release()
            if done.exception() is not None:
                self.errors.append(done.exception())
            else:
                on_written(sample)

        future.add_done_callback(finished)

    def _write(self, index, sample):
        import torch

        final = os.path.join(self.path, sample_name(index))
        # Hidden and not *.pt: training lists every *.pt under the directory.
        temp = os.path.join(self.path, ".%s.tmp.%d" % (sample_name(index), os.getpid()))
        try:
            torch.save(sample, temp)
            os.replace(temp, final)
        except BaseException as error:
            if os.path.exists(temp):
                os.unlink(temp)
            need = sample_bytes(sample) + SAMPLE_OVERHEAD
            full = disk_full_error(self.path, free_bytes(self.path), need, error)
            if full is not None:
                raise full from error
            raise

    def drain(self):
        """Wait for every write in flight (each ends renamed into place or with its temporary
        removed), then raise the first failed write's error."""
        self.pool.shutdown(wait=True)
        if self.errors:
            raise self.errors[0]


def load_sample(path):
    """A saved sample, mapped rather than read (a resume scan touches every file), tensors only."""
    import torch

    return torch.load(path, mmap=True, weights_only=True, map_location="cpu")


def sample_is_whole(sample, layers):
    if not isinstance(sample, dict) or not {"input_ids", "hidden_states", "loss_mask"} <= set(sample):
        return False
    length = sample["input_ids"].shape[0]
    states = sample["hidden_states"]
    return (sample["loss_mask"].shape == (length,) and isinstance(states, list) and len(states) == layers
            and all(state.dim() == 2 and state.shape[0] == length for state in states))


def sample_bytes(sample):
    """The bytes of a sample's tensors."""
    return (sample["input_ids"].nbytes + sample["loss_mask"].nbytes
            + sum(state.nbytes for state in sample["hidden_states"]))


def remove_temporaries(path):
    """Delete the samples a driver left half-written (their temporary names): a killed driver's."""
    for name in os.listdir(path):
        if name.startswith("." + SAMPLE_PREFIX) and ".tmp." in name:
            os.unlink(os.path.join(path, name))


def disk_full_error(path, free, need, error):
    """DiskFull naming the figures when want of space explains the failed write `error`, else None.

    torch.save reports a full disk without an errno ("basic_ios::clear: iostream error"), so the
    free space decides; an errno of ENOSPC or EDQUOT says it by itself.
    """
    if free >= need and getattr(error, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
        return None
    return DiskFull("%s: %s free, a sample needs about %s; %s: %s"
                    % (path, human_bytes(free), human_bytes(need), type(error).__name__, error))
