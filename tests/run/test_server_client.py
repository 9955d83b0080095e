"""remote/run/server/client.py and prepared.py: speculators' CLI steps as specrig runs and reads them.

The shares are checked against speculators' own `get_indices_to_process` where the lab's client
environment has it (speculators 0.9.0), and against a table everywhere; the Arrow row count against
files that `datasets` itself wrote.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from base import prepared
from run.server import client
from support.lab import require_lab

SPECULATORS_09 = Path("/home/specrig/venv-spec-0.9/bin/python")

#: (N, max_samples, world_size) -> every rank's share, as generate-offline-data splits them.
SHARES = [
    ((10, None, 1), [list(range(10))]),
    ((10, 4, 1), [[0, 1, 2, 3]]),
    ((10, None, 3), [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]),
    ((7, 5, 2), [[0, 1, 2], [3, 4]]),
    ((2, None, 3), [[0], [1], []]),
    ((0, None, 2), [[], []]),
]


@pytest.mark.parametrize(("case", "shares"), SHARES)
def test_each_rank_takes_speculators_contiguous_chunk(case, shares):
    total, max_samples, world = case
    assert [prepared.shard_indices(total, max_samples, world, rank) for rank in range(world)] == shares


@pytest.mark.runnable
def test_the_shares_equal_speculators_own_split_on_its_release():
    require_lab(SPECULATORS_09.exists(), "the lab's speculators 0.9.0 environment is not built (inv lab.up --runnable)")
    cases = [(n, m, w) for n in (0, 1, 7, 33, 100) for m in (None, 1, 5, 40) for w in (1, 2, 3, 8)]
    program = ("import json, sys\n"
               "from speculators.data_generation.offline import get_indices_to_process as f\n"
               "print(json.dumps([[f(n, m, [], w, r) for r in range(w)] for n, m, w in json.loads(sys.argv[1])]))\n")
    out = subprocess.run([str(SPECULATORS_09), "-c", program, json.dumps(cases)], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out.splitlines()[-1]) == [[prepared.shard_indices(n, m, w, r) for r in range(w)]
                                                for n, m, w in cases]
    # Two client processes a host: each host's share is speculators' chunks of its two ranks, in order.
    doubled = [(n, m, 2 * w) for n, m, w in cases]
    out = subprocess.run([str(SPECULATORS_09), "-c", program, json.dumps(doubled)], capture_output=True, text=True,
                         check=True).stdout
    assert [[share[2 * r] + share[2 * r + 1] for r in range(len(share) // 2)]
            for share in json.loads(out.splitlines()[-1])] == [
        [prepared.shard_indices(n, m, w, r, 2) for r in range(w)] for n, m, w in cases]


@pytest.mark.parametrize("clients", [2, 3, 5])
@pytest.mark.parametrize(("case", "shares"), SHARES)
def test_a_share_split_between_client_processes_is_the_same_chunk_of_each_world(case, shares, clients):
    """Several client processes on one host: client k runs speculators' rank rank*c+k of world*c. Their
    indices together are one contiguous run, the shares of all hosts together every index once."""
    total, max_samples, world = case
    together = [prepared.shard_indices(total, max_samples, world, rank, clients) for rank in range(world)]
    assert sorted(i for share in together for i in share) == list(range(min(total, max_samples or total)))
    assert all(share == list(range(share[0], share[0] + len(share))) for share in together if share)
    if world == 1:
        assert together == shares


def test_the_client_processes_split_the_concurrency_and_take_their_own_ranks():
    common = dict(model="/m", prepared="/p", output="/o", port=8765, request_timeout=120, max_retries=3)
    assert client.generate_argvs("py", clients=1, concurrency=32, **common) == [
        client.generate_argv("py", concurrency=32, **common)]
    argvs = client.generate_argvs("py", clients=3, concurrency=32, world_size=2, rank=1, **common)
    flags = [(argv[argv.index("--concurrency") + 1], argv[argv.index("--world-size") + 1],
              argv[argv.index("--rank") + 1]) for argv in argvs]
    assert flags == [("11", "6", "3"), ("11", "6", "4"), ("10", "6", "5")]


def test_skipped_samples_are_read_from_the_clients_last_summary():
    log = ("WARNING Skipping sample 3 due to error: boom\n"
           "INFO Saved 4 new data points to /out\n"
           "WARNING Skipped 2 samples due to errors: [3, 17]\n")
    assert client.skipped(log) == [3, 17]
    assert client.skipped("INFO Saved 6 new data points to /out\n") == []


def test_generate_argv_carries_the_shard_only_when_sharded():
    common = dict(model="/m", prepared="/p", output="/o", port=8765, concurrency=2, request_timeout=120,
                  max_retries=3)
    alone = client.generate_argv("py", **common)
    assert "--world-size" not in alone and alone[:4] == ["py", "-m", "speculators", "generate-offline-data"]
    assert alone[alone.index("--endpoint") + 1] == "http://127.0.0.1:8765/v1"
    sharded = client.generate_argv("py", world_size=3, rank=2, **common)
    assert sharded[-4:] == ["--world-size", "3", "--rank", "2"]


def test_prepare_argv_points_at_the_render_endpoint_without_v1():
    argv = client.prepare_argv("py", model="/m", dataset="/d.jsonl", output="/p", port=8000, seq_length=1024,
                               max_samples=6)
    assert argv[argv.index("--render-endpoint") + 1] == "http://127.0.0.1:8000"
    assert argv[-2:] == ["--max-samples", "6"]


def test_a_prepared_directory_is_complete_only_with_state_json_and_its_files(tmp_path):
    assert not prepared.complete(tmp_path)
    (tmp_path / "data-00000-of-00001.arrow").write_bytes(b"")  # what prepare-data alone would skip on
    assert not prepared.complete(tmp_path)
    (tmp_path / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"},
                                                                     {"filename": "data-00001-of-00002.arrow"}]}))
    assert not prepared.complete(tmp_path)
    (tmp_path / "data-00001-of-00002.arrow").write_bytes(b"")
    assert prepared.complete(tmp_path)
    with pytest.raises(prepared.PreparedDataError):
        prepared.rows(tmp_path / "nowhere")


@pytest.mark.runnable
def test_rows_are_counted_from_arrow_files_that_datasets_wrote(tmp_path):
    require_lab(SPECULATORS_09.exists(), "the lab's speculators 0.9.0 environment (datasets, pyarrow) is not built")
    program = ("import sys\nfrom datasets import Dataset\n"
               "rows = [{'input_ids': list(range(i % 5 + 1)), 'seq_len': i} for i in range(37)]\n"
               "Dataset.from_list(rows).save_to_disk(sys.argv[1], max_shard_size=200)\n"
               "Dataset.from_list([{'input_ids': [1]}]).select([]).save_to_disk(sys.argv[2])\n")
    subprocess.run([str(SPECULATORS_09), "-c", program, str(tmp_path / "many"), str(tmp_path / "empty")],
                   capture_output=True, check=True)
    assert len(prepared.data_files(tmp_path / "many")) > 1  # several shards, each counted
    assert prepared.rows(tmp_path / "many") == 37
    assert prepared.rows(tmp_path / "empty") == 0


@pytest.mark.runnable
def test_token_counts_are_the_lengths_of_input_ids_in_row_order(tmp_path):
    """As prepare-data writes them (input_ids int32 lists, loss_mask int64 lists, seq_len), over several
    shards; and behind a string column, so that input_ids' buffers are found by the features before it."""
    require_lab(SPECULATORS_09.exists(), "the lab's speculators 0.9.0 environment (datasets, pyarrow) is not built")
    program = ("import sys\nfrom datasets import Dataset, Features, List, Value\n"
               "rows = [{'input_ids': list(range((i * 7) % 23 + 1)), 'loss_mask': [1] * ((i * 7) % 23 + 1),"
               " 'seq_len': (i * 7) % 23 + 1} for i in range(37)]\n"
               "features = Features({'input_ids': List(Value('int32')), 'loss_mask': List(Value('int64')),"
               " 'seq_len': Value('int64')})\n"
               "Dataset.from_list(rows, features=features).save_to_disk(sys.argv[1], max_shard_size=2000)\n"
               "Dataset.from_list([{'text': 'x' * i, **row} for i, row in enumerate(rows)]).save_to_disk(sys.argv[2])\n")
    subprocess.run([str(SPECULATORS_09), "-c", program, str(tmp_path / "prepared"), str(tmp_path / "text")],
                   capture_output=True, check=True)
    expected = [(i * 7) % 23 + 1 for i in range(37)]
    assert len(prepared.data_files(tmp_path / "prepared")) > 1
    assert prepared.token_counts(tmp_path / "prepared") == expected
    assert prepared.token_counts(tmp_path / "text") == expected
    with pytest.raises(prepared.PreparedDataError, match="prepare-data did not finish"):
        prepared.token_counts(tmp_path / "nowhere")
