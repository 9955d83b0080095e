"""Validate the `hs_{i}.safetensors` files of server-mode extraction without torch (stdlib only).

What the files hold (docs/server-mode.md, "The files"): vLLM's ExampleHiddenStatesConnector writes
one safetensors file per request with two tensors, `token_ids` [T] (int64, the prompt's token ids)
and `hidden_states` [T, n_layers, hidden] (the model dtype: BF16, F16 or F32); speculators'
`generate-offline-data` moves it to `<output>/hs_{i}.safetensors`, i the sample's global index.
Under fp8 storage (docs/server-mode.md, "fp8 storage") hs-connectors' FP8HiddenStatesConnector writes
`hidden_states` as F8_E4M3 and a third tensor, `hidden_states_scales` [T, 1, 1] (F32): the stored
states are hidden_states x scales. A file of the other storage type than the run's is bad-shape.

The safetensors format (https://github.com/huggingface/safetensors, "Format"):

    8 bytes        N, an unsigned 64-bit little-endian integer: the size of the header
    N bytes        a UTF-8 JSON object (may be padded with trailing spaces):
                   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
                    "__metadata__": {"str": "str"} (optional)}
    rest           the byte buffer; data_offsets are relative to its start, [begin, end)

A valid file's tensors tile the buffer exactly: sorted by begin they start at 0, follow one another
without holes or overlaps, each is prod(shape) * itemsize bytes long, and the last ends at the
end of the file. A file cut short (a copy interrupted between filesystems, a writer killed) has a
buffer shorter than the header's largest end: that is `truncated` here.

Statuses, per index: ok, missing, unreadable (this user cannot open or read it: mode 000, another user's, an
I/O error), truncated, bad-header (undecodable or inconsistent header, trailing bytes), bad-shape (tensor names, dtypes or shapes not as expected), non-finite (NaN or Inf in the
hidden states; under fp8, in the states after scaling).

The NaN/Inf scan reads the hidden states once, in chunks, without converting a single value:
a BF16 or F32 element is NaN/Inf exactly when its exponent bits are all ones, and those live in
its two most significant bytes (little-endian: the last two). The scan slices out the top byte of
every element (bytes slicing, in C), looks for the only two byte values that can start a non-finite
element (0x7F, 0xFF, found with memchr) and checks the next byte down for those few candidates
only. F16's exponent lies entirely in its top byte: one byte test decides. About 1 GB/s of hidden
states on one core (967 MB/s for a 64 MiB bf16 sample from the page cache on the 2-core dev machine
under load; the slicing is the cost): tests/run/test_server_outputs.py, test_scan_speed.
float8_e4m3fn has no Inf and one NaN per sign, S.1111.111 (0x7F, 0xFF): two byte values, found with
memchr in the whole buffer. Its largest finite value is 448; a token's states stay finite after
scaling when its scale is finite and 448 x scale is within float32's range (the scales are read
whole: 4 bytes a token).
"""
import concurrent.futures
import json
import os
import re
import struct
import sys

if __name__ == "__main__":
    # Started by path, sys.path[0] is remote/base/: make it remote/, where the package base is (as on a host).
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from base import contract

#: Bytes per element of each safetensors dtype this module understands.
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8, "C64": 8,
}
INTEGER_DTYPES = ("I64", "I32", "U32", "I16", "U16", "U8", "I8", "U64")
#: The dtypes the connector can write for hidden states: vLLM 0.32's CacheOnlyAttentionBackend
#: supports float16, bfloat16 and float32 (model_executor/models/extract_hidden_states.py:98-102).
FLOAT_DTYPES = ("BF16", "F16", "F32")
#: fp8 storage's scales of each token's states (hs_connectors==0.9.0 fp8_utils.py:74).
SCALES = "hidden_states_scales"
#: The dtypes of hidden_states, by storage type (contract.STORAGES): float8_e4m3fn is safetensors' F8_E4M3
#: (hs_connectors==0.9.0 fp8_hidden_states_connector.py:33-38).
STORED_DTYPES = {contract.BF16: FLOAT_DTYPES, contract.FP8: ("F8_E4M3",)}
#: The tensors of each storage type's files.
STORED_TENSORS = {contract.BF16: ("token_ids", "hidden_states"), contract.FP8: ("token_ids", "hidden_states", SCALES)}
#: One-byte dtypes' non-finite encodings: float8_e4m3fn's NaN, S.1111.111 (it has no Inf).
_NONFINITE_BYTES = {"F8_E4M3": b"\x7f\xff"}
#: float8_e4m3fn's largest finite value, and float32's: a scale over F32_MAX / FP8_E4M3_MAX overflows.
FP8_E4M3_MAX = 448.0
F32_MAX = 3.4028234663852886e38
#: safetensors refuses headers larger than this (safetensors' MAX_HEADER_SIZE).
MAX_HEADER_SIZE = 100000000

OK, MISSING, UNREADABLE, TRUNCATED, BAD_HEADER, BAD_SHAPE, NON_FINITE = (
    "ok", "missing", "unreadable", "truncated", "bad-header", "bad-shape", "non-finite")
STATUSES = (OK, MISSING, UNREADABLE, TRUNCATED, BAD_HEADER, BAD_SHAPE, NON_FINITE)

FILE_PATTERN = re.compile(r"^hs_([0-9]+)\.safetensors$")
CHUNK_BYTES = 8 << 20


class SafetensorsError(Exception):
    """A file that is not a complete, valid safetensors file; `kind` is TRUNCATED or BAD_HEADER."""

    def __init__(self, kind, detail):
        Exception.__init__(self, detail)
        self.kind = kind
        self.detail = detail


def file_name(index):
    return "hs_%d.safetensors" % index


def read_header(path):
    """The header of safetensors file `path`, checked against the file's size (nothing else is read).

    Returns {"tensors": {name: {"dtype", "shape", "begin", "end"}} (begin/end absolute file
    offsets), "metadata": dict, "data_start": 8 + N, "file_size": bytes}. Raises SafetensorsError.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SafetensorsError(TRUNCATED, "%d bytes: shorter than the 8-byte header length" % size)
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_SIZE:
            raise SafetensorsError(BAD_HEADER, "header length %d exceeds %d" % (n, MAX_HEADER_SIZE))
        if 8 + n > size:
            raise SafetensorsError(TRUNCATED, "header of %d bytes announced, %d in the file" % (n, size - 8))
        raw = f.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(BAD_HEADER, "header is not UTF-8: %s" % e) from None
    if not text.startswith("{"):
        raise SafetensorsError(BAD_HEADER, "header does not start with '{'")
    try:
        header = json.loads(text)
    except ValueError as e:
        raise SafetensorsError(BAD_HEADER, "header is not JSON: %s" % e) from None
    if not isinstance(header, dict):
        raise SafetensorsError(BAD_HEADER, "header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError(BAD_HEADER, "__metadata__ is not an object")
    data_start = 8 + n
    buffer_len = size - data_start
    tensors = {}
    spans = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise SafetensorsError(BAD_HEADER, "tensor %r: entry is not an object" % name)
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise SafetensorsError(BAD_HEADER, "tensor %r: unknown dtype %r" % (name, dtype))
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise SafetensorsError(BAD_HEADER, "tensor %r: bad shape %r" % (name, shape))
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets)
                or offsets[0] > offsets[1]):
            raise SafetensorsError(BAD_HEADER, "tensor %r: bad data_offsets %r" % (name, offsets))
        nbytes = DTYPE_SIZES[dtype]
        for d in shape:
            nbytes *= d
        if offsets[1] - offsets[0] != nbytes:
            raise SafetensorsError(BAD_HEADER, "tensor %r: data_offsets %r hold %d bytes, %s %s needs %d"
                                   % (name, offsets, offsets[1] - offsets[0], dtype, shape, nbytes))
        spans.append((offsets[0], offsets[1], name))
        tensors[name] = {"dtype": dtype, "shape": list(shape),
                         "begin": data_start + offsets[0], "end": data_start + offsets[1]}
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise SafetensorsError(BAD_HEADER, "tensor %r starts at %d, expected %d (hole or overlap)"
                                   % (name, begin, position))
        position = end
    if buffer_len < position:
        raise SafetensorsError(TRUNCATED, "data region has %d of %d bytes" % (buffer_len, position))
    if buffer_len > position:
        raise SafetensorsError(BAD_HEADER, "%d bytes after the last tensor" % (buffer_len - position))
    return {"tensors": tensors, "metadata": metadata, "data_start": data_start, "file_size": size}


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# -- NaN / Inf -------------------------------------------------------------------------------------

#: Top-byte values that can start a NaN/Inf: exponent bits all ones. BF16 and F32 (8 exponent bits:
#: 7 in the top byte, 1 in the next) need the next byte's high bit too; F16's 5 lie in the top byte.
_CANDIDATES_8BIT_EXPONENT = b"\x7f\xff"
_F16_NONFINITE_TOP = bytes(b for b in range(256) if b & 0x7C == 0x7C)
_F16_NONFINITE_MARKERS = tuple(bytes((b,)) for b in _F16_NONFINITE_TOP)


def count_nonfinite(path, begin, end, dtype, chunk_bytes=CHUNK_BYTES):
    """(count, first element index or None) of NaN/Inf elements of the `dtype` tensor stored at
    absolute file offsets [begin, end) of `path`, read in chunks of about `chunk_bytes`."""
    if dtype not in FLOAT_DTYPES and dtype not in _NONFINITE_BYTES:
        raise ValueError("no NaN/Inf scan for dtype %r" % dtype)
    size = DTYPE_SIZES[dtype]
    chunk_bytes = max(size, chunk_bytes - chunk_bytes % size)
    count, first, element = 0, None, 0
    with open(path, "rb") as f:
        f.seek(begin)
        remaining = end - begin
        while remaining > 0:
            chunk = f.read(min(chunk_bytes, remaining))
            if not chunk:
                raise SafetensorsError(TRUNCATED, "file ended %d bytes early" % remaining)
            chunk = chunk[:len(chunk) - len(chunk) % size]
            remaining -= len(chunk)
            found, first_here = _nonfinite_in_chunk(chunk, dtype, size)
            if found:
                if first is None:
                    first = element + first_here
                count += found
            element += len(chunk) // size
    return count, first


def _nonfinite_in_chunk(chunk, dtype, size):
    if dtype in _NONFINITE_BYTES:
        markers = _NONFINITE_BYTES[dtype]
        if not any(bytes((marker,)) in chunk for marker in markers):  # memchr: near free
            return 0, None
        return len(chunk) - len(chunk.translate(None, markers)), _first_byte_in(chunk, markers)
    top = chunk[size - 1::size]  # the top byte of every element (the slicing is the main cost)
    if dtype == "F16":
        if not any(marker in top for marker in _F16_NONFINITE_MARKERS):  # memchr: near free
            return 0, None
        hits = len(top) - len(top.translate(None, _F16_NONFINITE_TOP))
        return hits, _first_byte_in(top, _F16_NONFINITE_TOP)
    if b"\x7f" not in top and b"\xff" not in top:
        return 0, None
    # Candidates: exponent's top 7 bits are ones; non-finite when the last exponent bit (the high
    # bit of the next byte down) is set too.
    found, first = 0, None
    for marker in _CANDIDATES_8BIT_EXPONENT:
        position = top.find(bytes((marker,)))
        while position >= 0:
            if chunk[position * size + size - 2] & 0x80:
                found += 1
                if first is None or position < first:
                    first = position
            position = top.find(bytes((marker,)), position + 1)
    return found, first


def _first_byte_in(data, values):
    positions = [data.find(bytes((b,))) for b in values]
    positions = [p for p in positions if p >= 0]
    return min(positions) if positions else None


def unscalable_token(path, scales):
    """(token, scale) of the first token whose scale (the F32 tensor `scales`, a read_header() entry) leaves
    its dequantized states non-finite: a NaN or Inf scale, or one that 448 x overflows float32; None."""
    with open(path, "rb") as f:
        f.seek(scales["begin"])
        raw = f.read(scales["end"] - scales["begin"])
    if len(raw) != scales["end"] - scales["begin"]:
        raise SafetensorsError(TRUNCATED, "file ended %d bytes early" % (scales["end"] - scales["begin"] - len(raw)))
    for token, scale in enumerate(struct.unpack("<%df" % (len(raw) // 4), raw)):
        if not abs(scale) * FP8_E4M3_MAX <= F32_MAX:  # NaN fails the comparison too
            return token, scale
    return None


def storage_of(tensors):
    """The storage type a file's tensors (read_header()'s) were written with: fp8 with scales or F8 states."""
    hidden = tensors.get("hidden_states") or {}
    fp8 = SCALES in tensors or hidden.get("dtype") in STORED_DTYPES[contract.FP8]
    return contract.FP8 if fp8 else contract.BF16


# -- one file, a dataset -----------------------------------------------------------------------------

def os_error_status(error):
    """The status of a file whose opening or reading raised OSError `error`: missing once removed, else unreadable
    with the reason, not the path (its row names it): "[Errno 13] Permission denied"."""
    if isinstance(error, FileNotFoundError):
        return {"status": MISSING, "detail": "no such file"}
    return {"status": UNREADABLE, "detail": "[Errno %s] %s" % (error.errno, error.strerror) if error.strerror else str(error)}


def reason(report):
    """A file status (check_file's, os_error_status's) as one row's reason: "truncated: data region has ..."."""
    return "%s: %s" % (report["status"], report["detail"])


def check_file(path, **checks):
    """The status of one `hs_{i}.safetensors` file, _file_status()'s; never raises for the file (a supervisor's
    check, `inv gather`'s and verify-dataset's name it): removed is missing, a file this user cannot read
    (mode 000, another user's) or an I/O error is unreadable."""
    try:
        return _file_status(path, **checks)
    except OSError as error:
        return os_error_status(error)


def _file_status(path, n_layers=None, hidden_size=None, num_tokens=None, scan_values=True,
                 allow_extra_tensors=False, chunk_bytes=CHUNK_BYTES, storage=contract.BF16):
    """{"status", "detail", "tokens", "layers", "hidden", "dtype", "storage", "bytes"} (shape fields once the
    header could be read); raises OSError.

    n_layers, hidden_size, num_tokens: expected sizes, checked when given. scan_values: read the
    hidden states and look for NaN/Inf (the only part that reads more than the header), and under fp8
    the scales. storage: the run's storage type (contract.STORAGES), whose layout the file must have.
    """
    result = {"status": OK, "detail": ""}
    try:
        header = read_header(path)
    except SafetensorsError as e:
        result.update(status=e.kind, detail=e.detail)
        return result
    result["bytes"] = header["file_size"]
    tensors = header["tensors"]
    result["storage"] = storage_of(tensors)
    problem = _shape_problem(tensors, n_layers, hidden_size, num_tokens, allow_extra_tensors, storage)
    hidden = tensors.get("hidden_states")
    if hidden is not None and len(hidden["shape"]) == 3:
        result.update(tokens=hidden["shape"][0], layers=hidden["shape"][1], hidden=hidden["shape"][2],
                      dtype=hidden["dtype"])
    if problem:
        result.update(status=BAD_SHAPE, detail=problem)
        return result
    if scan_values:
        try:
            count, first = count_nonfinite(path, hidden["begin"], hidden["end"], hidden["dtype"], chunk_bytes)
            unscalable = unscalable_token(path, tensors[SCALES]) if storage == contract.FP8 else None
        except SafetensorsError as e:  # shrank while being read
            result.update(status=e.kind, detail=e.detail)
            return result
        if count:
            tokens, layers, width = hidden["shape"]
            token, rest = divmod(first, layers * width)
            result.update(status=NON_FINITE,
                          detail="%d NaN/Inf values in hidden_states; first at token %d, layer slot %d"
                                 % (count, token, rest // width))
        elif unscalable:
            result.update(status=NON_FINITE, detail="hidden_states_scales: token %d has scale %r: its states are "
                                                    "not finite after scaling" % unscalable)
    return result


def _shape_problem(tensors, n_layers, hidden_size, num_tokens, allow_extra_tensors, storage):
    found = storage_of(tensors)
    if found != storage:
        return "a file of %s storage (hidden_states %s%s), where the run stores %s" % (
            found, (tensors.get("hidden_states") or {}).get("dtype"),
            ", with hidden_states_scales" if SCALES in tensors else ", no hidden_states_scales", storage)
    expected = STORED_TENSORS[storage]
    missing = [name for name in expected if name not in tensors]
    if missing:
        return "missing tensors: %s (has %s)" % (", ".join(missing), ", ".join(sorted(tensors)) or "none")
    extra = sorted(set(tensors) - set(expected))
    if extra and not allow_extra_tensors:
        return "unexpected tensors: %s" % ", ".join(extra)
    ids, hidden = tensors["token_ids"], tensors["hidden_states"]
    if ids["dtype"] not in INTEGER_DTYPES:
        return "token_ids has dtype %s, expected an integer type" % ids["dtype"]
    if len(ids["shape"]) != 1:
        return "token_ids has shape %s, expected [T]" % ids["shape"]
    if hidden["dtype"] not in STORED_DTYPES[storage]:
        return "hidden_states has dtype %s, expected %s" % (hidden["dtype"], " or ".join(STORED_DTYPES[storage]))
    if len(hidden["shape"]) != 3:
        return "hidden_states has shape %s, expected [T, n_layers, hidden]" % hidden["shape"]
    tokens, layers, width = hidden["shape"]
    if tokens != ids["shape"][0]:
        return "hidden_states has %d tokens, token_ids %d" % (tokens, ids["shape"][0])
    if tokens == 0:
        return "no tokens"
    if storage == contract.FP8:
        scales = tensors[SCALES]
        if scales["dtype"] != "F32" or scales["shape"] != [tokens, 1, 1]:
            return "hidden_states_scales is %s %s, expected F32 [%d, 1, 1]" % (scales["dtype"], scales["shape"], tokens)
    if num_tokens is not None and tokens != num_tokens:
        return "%d tokens, expected %d" % (tokens, num_tokens)
    if n_layers is not None and layers != n_layers:
        return "%d layers, expected %d" % (layers, n_layers)
    if hidden_size is not None and width != hidden_size:
        return "hidden size %d, expected %d" % (width, hidden_size)
    return ""


def existing_indices(directory):
    """Sorted indices i of the files named hs_{i}.safetensors (digits only) in `directory`."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = FILE_PATTERN.match(name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


class CheckedFiles:
    """The files already found ok, each with the (inode, size, mtime) it had when read: the same bytes
    are not read again. A supervisor checks files as they arrive, while the client still writes
    others, so that its check at the end reads only the last ones (a full NaN/Inf scan of an 8B
    model's 512 samples, 21.8 GB, took 15 s on the H200 host: issue 19). Any change to a file (a
    rewrite, a truncation, a copy finishing) changes its stat, and it is read again."""

    def __init__(self):
        self.ok = {}

    @staticmethod
    def stat(path):
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns

    def check(self, index, path, **checks):
        """check_file(path, **checks), or ok without reading `path` when it is known ok as it is now."""
        known, stat = self._known(index, path)
        if known:
            return {"status": OK, "detail": ""}
        report = check_file(path, **checks)
        self._record(index, path, stat, report)
        return report

    def check_all(self, files, checks, pool):
        """check() of each (index, path) of `files`, the reading on `pool`'s processes (a
        concurrent.futures executor): several cores keep up with a client that lands files faster than
        one core scans them. A file whose check was cancelled or failed stays unknown."""
        pending = {}
        for index, path in files:
            known, stat = self._known(index, path)
            if not known:
                pending[pool.submit(check_file, path, **checks)] = (index, path, stat)
        for future in concurrent.futures.as_completed(pending):
            try:
                report = future.result()
            except Exception:  # cancelled or failed: the final check reads it again and names it
                continue
            self._record(*pending[future], report)

    def _known(self, index, path):
        """(whether `path` is known ok as it is now, its stat); what was known of another stat is forgotten."""
        stat = self.stat(path)
        if stat is not None and self.ok.get(index) == stat:
            return True, stat
        self.ok.pop(index, None)
        return False, stat

    def _record(self, index, path, stat, report):
        if report["status"] == OK and stat is not None and stat == self.stat(path):
            self.ok[index] = stat


def check_dataset(directory, num_samples, indices=None, n_layers=None, hidden_size=None,
                  scan_values=True, allow_extra_tensors=False, chunk_bytes=CHUNK_BYTES, checked=None,
                  storage=contract.BF16):
    """Every sample of a dataset of `num_samples` (or only `indices`, e.g. one rank's share).

    Returns {"expected", "counts": {status: n}, "by_status": {status: [indices]} (every status but
    ok), "missing": [indices], "complete": bool, "files": {index: check_file result} (not ok only),
    "extra": [indices of files outside the expected set]}. A sample counts as done only when ok.
    `checked` (CheckedFiles): files it knows ok are not read again, and those found ok join it.
    """
    wanted = list(range(num_samples)) if indices is None else sorted(set(indices))
    present = set(existing_indices(directory))
    checks = dict(n_layers=n_layers, hidden_size=hidden_size, scan_values=scan_values,
                  allow_extra_tensors=allow_extra_tensors, chunk_bytes=chunk_bytes, storage=storage)
    counts = dict((status, 0) for status in STATUSES)
    by_status = {}
    files = {}
    for index in wanted:
        path = os.path.join(directory, file_name(index))
        if index not in present:
            report = {"status": MISSING, "detail": "no such file"}
        elif checked is not None:
            report = checked.check(index, path, **checks)
        else:
            report = check_file(path, **checks)
        counts[report["status"]] += 1
        if report["status"] != OK:
            by_status.setdefault(report["status"], []).append(index)
            files[index] = report
    wanted_set = set(wanted)
    return {
        "expected": len(wanted),
        "counts": counts,
        "by_status": by_status,
        "missing": by_status.get(MISSING, []),
        "complete": counts[OK] == len(wanted),
        "files": files,
        "extra": sorted(present - wanted_set),
    }


def main(argv):
    """`python outputs.py DIRECTORY NUM_SAMPLES [N_LAYERS HIDDEN_SIZE [STORAGE]]`: the report as JSON; exit 1
    unless complete."""
    directory, num_samples = argv[0], int(argv[1])
    n_layers = int(argv[2]) if len(argv) > 2 else None
    hidden_size = int(argv[3]) if len(argv) > 3 else None
    storage = argv[4] if len(argv) > 4 else contract.BF16
    report = check_dataset(directory, num_samples, n_layers=n_layers, hidden_size=hidden_size, storage=storage)
    report["files"] = dict((str(k), v) for k, v in report["files"].items())
    print(json.dumps(report, indent=1, sort_keys=True))
    return 0 if report["complete"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
