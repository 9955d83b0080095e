"""Supervised runs submitted to Slurm from the login node (stdlib only): one run as one job, a sharded
run's tasks as one job array, a multi-node job's runs as one job of their nodes; each run's job
recorded in its run.json. The job scripts and sbatch are slurm/jobs.py's.

    runs.submit-array {"workdir", "sharded_run_id"} the array's task runs (launched with `array`)
                                                  submitted as one job array
    runs.submit-nodes {"workdir", "job_id"}       a multi-node job's runs (launched with `nodes` and
                                                  `slurm`) submitted as one job of its nodes

A run launched (or resumed) with `slurm` alone is submitted by its launch (run/supervisor_start.py
start, submit_run here).
"""
import os
import shutil

from base import atomic, rundir
from base.failure import RemoteFailure
from slurm import jobs


def submit_run(run):
    """The run's supervisor as a Slurm job, its id recorded in run.json; RemoteFailure slurm-refused
    with sbatch's words when Slurm refuses it (nothing is queued). A task of a job array is submitted
    with its array (submit_array) at its launch, and alone, from the array's script, again; a node of
    a multi-node job with its job (submit_nodes), and never alone."""
    record = run.record
    slurm = record["slurm"]
    if (slurm.get("array") or record.get("nodes")) and not slurm["job_id"]:
        return
    if record.get("nodes"):
        raise RemoteFailure("bad-argument", "run %s is node %d of multi-node job %s, one Slurm job: resuming it "
                            "alone is not built; start the job again with `inv extract --nodes`"
                            % (run.run_id, record["nodes"]["node_rank"], record["nodes"]["job_id"]))
    try:
        if slurm.get("array"):
            submitted = {"job_id": jobs.resubmit_task(slurm["script"], slurm["array"]["task"], slurm["settings"])}
        else:
            submitted = jobs.submit(slurm["settings"], run_path=run.path, run_id=run.run_id, python=record["python"])
    except jobs.JobRefused as refused:
        raise RemoteFailure("slurm-refused", "run %s: %s; nothing was queued" % (run.run_id, refused)) from None
    record_job(run, record, submitted)


def record_job(run, record, submitted):
    """The run's (newest) job in run.json: {job_id, script...}, its id added to job_ids."""
    record["slurm"].update(submitted, job_ids=record["slurm"]["job_ids"] + [submitted["job_id"]],
                           submitted_at=rundir.now_iso())
    atomic.write_json(run.file("run.json"), record)


def submit_array(args):
    """`runs.submit-array` {"workdir", "sharded_run_id"}: the runs launched as the tasks of a sharded run's
    job array (launch's `array`), submitted as one array: its script and outputs in
    <workdir>/runs/<sharded_run_id>/. {job_id, script, runs: [run ids by task]}. Refused by sbatch: the
    task runs are removed, nothing was queued."""
    workdir = rundir.workdir_of(args)
    sharded_run_id = args.get("sharded_run_id")
    tasks = sorted((run for run in rundir.all_runs(workdir) if rundir.group_id(run) == sharded_run_id
                    and (run.record.get("slurm") or {}).get("array")),
                   key=lambda run: run.record["slurm"]["array"]["task"])
    if not tasks or [run.record["slurm"]["array"]["task"] for run in tasks] != list(range(len(tasks))):
        raise RemoteFailure("bad-argument", "no job array's runs of %r under %s" % (sharded_run_id, workdir))
    directory = os.path.join(rundir.runs_root(workdir), sharded_run_id)
    first = tasks[0].record
    return _submit_together(
        tasks, directory, "sharded run %s" % sharded_run_id, lambda job_id, task: "%s_%d" % (job_id, task),
        lambda: jobs.submit_array(first["slurm"]["settings"], directory=directory, sharded_run_id=sharded_run_id,
                                  run_paths=[run.path for run in tasks], python=first["python"]))


def submit_nodes(args):
    """`runs.submit-nodes` {"workdir", "job_id"}: the runs launched as the nodes of a multi-node job on a
    Slurm login node (launch's `nodes` and `slurm`), submitted as one job of as many nodes (slurm/jobs.py
    nodes_script): its script and output in <workdir>/runs/<job_id>/. {job_id (Slurm's), script, runs:
    [run ids by node rank]}. Refused by sbatch: the runs are removed, nothing was queued."""
    workdir = rundir.workdir_of(args)
    job_id = args.get("job_id")
    members = sorted((run for run in rundir.all_runs(workdir) if (run.record.get("nodes") or {}).get("job_id") == job_id
                      and run.record.get("slurm")), key=lambda run: run.record["nodes"]["node_rank"])
    ranks = [run.record["nodes"]["node_rank"] for run in members]
    if len(members) < 2 or ranks != list(range(members[0].record["nodes"]["nnodes"])):
        raise RemoteFailure("bad-argument", "no multi-node job's runs of %r under %s (ranks found: %s)"
                            % (job_id, workdir, ranks))
    directory = os.path.join(rundir.runs_root(workdir), job_id)
    first = members[0].record
    return _submit_together(
        members, directory, "multi-node job %s" % job_id, lambda slurm_job_id, rank: slurm_job_id,
        lambda: jobs.submit_nodes(first["slurm"]["settings"], directory=directory, job_id=job_id,
                                  run_paths=[run.path for run in members], python=first["python"]))


def _submit_together(runs, directory, what, job_of, submit):
    """`runs` submitted as one Slurm submission (`submit()`: its job id, its script in `directory`), each
    run's job recorded (job_of(job id, its index)): {job_id, script, runs}. Refused by sbatch: the runs and
    `directory` are removed, nothing was queued (RemoteFailure slurm-refused, naming `what`)."""
    try:
        job_id = submit()
    except jobs.JobRefused as refused:
        for run in runs:
            shutil.rmtree(run.path, ignore_errors=True)
        shutil.rmtree(directory, ignore_errors=True)
        raise RemoteFailure("slurm-refused", "%s: %s; nothing was queued" % (what, refused)) from None
    script = os.path.join(directory, jobs.SCRIPT)
    for index, run in enumerate(runs):
        record_job(run, run.record, {"job_id": job_of(job_id, index), "script": script})
    return {"job_id": job_id, "script": script, "runs": [run.run_id for run in runs]}
