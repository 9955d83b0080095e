"""A multi-node job in one Slurm allocation, as data (specrig/run/slurm_node_job.py): its shape from
slurm.nodes, its records before the allocation, and a request that could never be one refused in one line
before the login node is reached. tests/lab/test_lab_slurm_multinode.py runs the job."""
import pytest

from specrig.errors import UsageError
from specrig.inventory import Host
from specrig.run import slurm_node_job


def login(nodes):
    return Host(name="login", hostname="10.0.0.1", scheduler="slurm", slurm={"partition": "gpu", "nodes": nodes},
                extract={"model": "/m", "data": "/d.jsonl", "out": "/o"})


def test_the_job_has_a_record_per_node_of_slurm_nodes_the_hosts_left_to_the_allocation():
    request, records = slurm_node_job.plan_job(login(3), {"max_samples": 8}, mode="dp")
    assert [(r["node_rank"], r["role"]) for r in records] == [(0, "head"), (1, "worker"), (2, "worker")]
    assert len({r["job_id"] for r in records}) == 1 and records[0]["job_id"].startswith("nodes-")
    assert records[0]["data_parallel_size"] == 3 and records[0]["nnodes"] == 3
    assert records[1]["hosts"] == [slurm_node_job.UNALLOCATED] * 3 and request.driver_args["max_samples"] == 8


@pytest.mark.parametrize("nodes, options, message", [
    (1, {"mode": "dp"}, "--nodes 'dp' on login: hosts.login.slurm.nodes is 1, and a multi-node job needs two nodes"),
    (2, {"mode": "tp-pp", "pp": 3}, "--nodes 'tp-pp': tensor x pipeline parallel 1 x 3 = 3 GPUs do not split evenly "
                                    "over 2 nodes"),
    (2, {"mode": "dp", "rendezvous_port": 0}, "--rendezvous-port 0: give a port number, 1-65535"),
])
def test_a_job_that_cannot_be_is_refused_in_one_line(nodes, options, message):
    with pytest.raises(UsageError) as refused:
        slurm_node_job.plan_job(login(nodes), {}, **options)
    assert refused.value.message.startswith(message), refused.value.message
