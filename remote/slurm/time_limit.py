"""What a Slurm job's time limit means for its run (stdlib only), decided by the run's supervisor when the
job's shell hands it USR1 (`--signal=B:USR1@<s>`, slurm/jobs.py supervised()).

The job is requeued to go on where it stopped, which is progress only when this job wrote samples. One
that wrote none (its time went to the model's load, or to prepare-data) would be requeued, wait, load
again and be warned at the same point, forever: its run fails instead, as TIME_LIMIT_TOO_SHORT, naming
a longer `slurm.time`. What a job wrote is what the supervisor already records of each attempt:
`samples_written`, the sample files new or rewritten during it (in-process each is renamed into place
whole; in server mode the next attempt checks them), the check the restart policy makes of a repeated
failure.
"""
from base.contract import TIME_LIMIT_TOO_SHORT
from slurm.jobs import signal_before_end_s


def too_short(attempts, *, settings, ran_s, phase):
    """The TIME_LIMIT_TOO_SHORT failure's {kind, explain, advice} when none of `attempts` (this job's
    attempt records) wrote a sample, else None: the run stops, and the job is requeued. `settings`: the
    run's `slurm:` settings; `ran_s`: the seconds from the job's start to the warning; `phase`: what the
    workload was doing then (its heartbeat's phase, or None)."""
    if any(attempt.get("samples_written") for attempt in attempts):
        return None
    limit = settings.get("time")
    named = "slurm.time %s" % limit if limit is not None else "the partition's time limit (slurm.time unset)"
    doing = ", while %s" % phase if phase else ""
    explain = ("the Slurm job was warned of its time limit %.0f s after it started%s, before any sample was written "
               "(%s, warned about %d s before its end): requeued, the next job would end the same way"
               % (ran_s, doing, named, signal_before_end_s(settings)))
    advice = ("set a longer slurm.time for the host in hosts.yaml (%s), long enough for the model's load and "
              "some samples, then `inv resume`: a resumed job takes hosts.yaml's slurm: settings"
              % ("now %s" % limit if limit is not None else "unset now"))
    return {"kind": TIME_LIMIT_TOO_SHORT, "explain": explain, "advice": advice}

