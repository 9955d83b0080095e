"""A sharded run's tasks as one job array, as data (specrig/run/slurm_job_array.py): each task's shard and
output, and in server mode a port of its own, since Slurm may put several tasks on one node."""
from specrig.inventory import Host
from specrig.run.slurm_job_array import own_port, task_requests

HOST = Host(name="c", python="/venv/bin/python", workdir="/shared/specrig", scheduler="slurm", slurm={"time": 30})


def test_each_task_is_a_shard_with_its_own_output():
    requests = task_requests(HOST, {"model": "/m", "data": "/d.jsonl", "out": "/shared/out/"}, 3)
    assert [(r.driver_args["shard_index"], r.driver_args["shard_count"], r.driver_args["output_dir"])
            for r in requests] == [(0, 3, "/shared/out/task-0"), (1, 3, "/shared/out/task-1"), (2, 3, "/shared/out/task-2")]


def test_a_server_mode_task_serves_on_the_runs_port_plus_its_index():
    requests = task_requests(HOST, {"model": "/m", "data": "/d.jsonl", "out": "/o"}, 2)
    assert [own_port(request, task).driver_args["port"] for task, request in enumerate(requests)] == [8000, 8001]
    given = task_requests(HOST, {"model": "/m", "data": "/d.jsonl", "out": "/o", "port": 18400}, 2)
    assert [own_port(request, task).driver_args["port"] for task, request in enumerate(given)] == [18400, 18401]
    assert "port" not in requests[1].driver_args  # the request itself is left as it was
