"""A Slurm job's time limit, decided on the attempts' records (remote/slurm/time_limit.py): the run stops
for its job to be requeued only when this job wrote samples; else it fails, naming a longer slurm.time."""
import pytest

from base.contract import TIME_LIMIT_TOO_SHORT
from slurm import time_limit


def attempt(number: int, samples_written: int | None) -> dict:
    """An attempt's record as status.json holds it (the fields the decision reads, and some it does not)."""
    return {"attempt": number, "started_at": "2026-12-02T00:00:00Z", "ended_at": "2026-12-02T00:01:00Z",
            "exit_status": None, "failure": None, "samples_written": samples_written}


@pytest.mark.parametrize("attempts", [
    [attempt(3, 12)],
    [attempt(3, 0), attempt(4, 1)],  # a restart inside the job wrote one
    [attempt(3, 5), attempt(4, 0)],  # one before the restart did
], ids=["the one attempt wrote samples", "the second attempt did", "the first attempt did"])
def test_a_job_that_wrote_samples_is_requeued(attempts):
    assert time_limit.too_short(attempts, settings={"time": 2}, ran_s=90, phase="extracting") is None


@pytest.mark.parametrize("attempts", [
    [attempt(1, 0)],
    [attempt(3, 0), attempt(4, 0)],
    [attempt(2, None)],  # ended before its files were counted
    [],  # warned before its first attempt began
], ids=["no sample", "two attempts, no sample", "not counted", "no attempt"])
def test_a_job_that_wrote_no_sample_fails_naming_its_time_limit(attempts):
    found = time_limit.too_short(attempts, settings={"time": "00:01:00"}, ran_s=31.4, phase="loading")
    assert found["kind"] == TIME_LIMIT_TOO_SHORT == "time-limit-too-short"
    assert found["explain"] == ("the Slurm job was warned of its time limit 31 s after it started, while loading, before "
                                "any sample was written (slurm.time 00:01:00, warned about 15 s before its end): "
                                "requeued, the next job would end the same way")
    assert found["advice"].startswith("set a longer slurm.time for the host in hosts.yaml (now 00:01:00)")
    assert "`inv resume`" in found["advice"]


def test_without_a_time_of_its_own_the_partitions_limit_is_named():
    found = time_limit.too_short([attempt(1, 0)], settings={}, ran_s=600, phase=None)
    assert "(the partition's time limit (slurm.time unset), warned about 120 s before its end)" in found["explain"]
    assert ", while" not in found["explain"] and "(unset now)" in found["advice"]
