"""prepare-data's output directory: is it whole, and how many rows does it hold (stdlib only).

prepare-data writes a `datasets` directory with `Dataset.save_to_disk`: Arrow IPC stream files
(`data-0000i-of-0000n.arrow`), then `dataset_info.json` and `state.json`, which lists the data
files. Its N (the rows: one per assistant turn, not per conversation, docs/server-mode.md §7) is
what generate-offline-data splits and indexes, so the supervisor needs it without `datasets`.

The Arrow IPC stream format (https://arrow.apache.org/docs/format/Columnar.html, "Encapsulated
message format"): a sequence of messages, each
    0xFFFFFFFF (continuation; absent in the pre-0.15 format), int32 metadata size M,
    M bytes: a flatbuffer `Message` {version: short, header_type: ubyte, header: union,
             bodyLength: long, custom_metadata}, padded to 8 bytes,
    bodyLength bytes of body,
ended by a size of 0. A `RecordBatch` header (header_type 3) starts with `length: long`, its rows.
"""
import json
import os
import struct

CONTINUATION = 0xFFFFFFFF
RECORD_BATCH = 3


class PreparedDataError(Exception):
    """A prepared directory that cannot be read as prepare-data writes it; the message says why."""


def data_files(directory):
    """The data files state.json lists, or None when state.json is missing or unreadable."""
    try:
        with open(os.path.join(directory, "state.json")) as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        return None
    return [entry.get("filename") for entry in state.get("_data_files") or []]


def complete(directory):
    """Whether prepare-data finished `directory`: state.json present and every file it lists present.
    prepare-data itself skips any directory holding an `*.arrow`, and one killed while save_to_disk
    wrote leaves shards without state.json (docs/server-mode.md §5), so that test is not enough."""
    files = data_files(directory)
    return files is not None and all(name and os.path.isfile(os.path.join(directory, name)) for name in files)


def whole(directory):
    """complete(), and dataset_info.json whole too: `Dataset.save_to_disk` writes it last, after state.json
    (datasets 5.1.0 arrow_dataset.py), so once it parses prepare-data has nothing left to write, though its
    process may take seconds more to exit (3.6 s on the lab: warm_steps lets generate-offline-data go at once)."""
    if not complete(directory):
        return False
    try:
        with open(os.path.join(directory, "dataset_info.json")) as handle:
            json.load(handle)
    except (OSError, ValueError):
        return False
    return True


def rows(directory):
    """N: the rows of the prepared dataset in `directory`. PreparedDataError when not complete."""
    if not complete(directory):
        raise PreparedDataError("%s holds no state.json, or not every data file it lists: prepare-data did not "
                                "finish" % directory)
    files = data_files(directory)
    return sum(stream_rows(os.path.join(directory, name)) for name in files)


def stream_rows(path):
    """The rows of one Arrow IPC stream file: the sum of its record batches' lengths."""
    return sum(_long_field(metadata, header, 0) or 0 for metadata, header, _ in _record_batches(path, None))


def token_counts(directory):
    """The tokens of each row of the prepared dataset in `directory`, in row order: the lengths of its
    `input_ids` lists (what generate-offline-data sends as the prompt, and the connector stores one state
    per token of), read from the list column's offsets. PreparedDataError when not complete, or when the
    schema is not one this reader walks (dataset_info.json's features say where input_ids' buffers are)."""
    if not complete(directory):
        raise PreparedDataError("%s holds no state.json, or not every data file it lists: prepare-data did not "
                                "finish" % directory)
    column = _input_ids_buffers(directory)
    counts = []
    for name in data_files(directory):
        path = os.path.join(directory, name)
        for metadata, header, body in _record_batches(path, column):
            counts += _list_lengths(metadata, header, body, column, path)
    return counts


def _record_batches(path, column):
    """(metadata, RecordBatch header position, body or None) of each record batch of a stream file; the
    body is read only when `column` (a column's buffers, _input_ids_buffers()) is wanted."""
    with open(path, "rb") as handle:
        while True:
            size = _read_int32(handle, path)
            if size == -1:  # the continuation marker: the size follows
                size = _read_int32(handle, path)
            if size == 0:
                return
            metadata = handle.read(size)
            if len(metadata) != size:
                raise PreparedDataError("%s: cut short in a message's metadata" % path)
            header_type, header, body_length = _message(metadata, path)
            if header_type == RECORD_BATCH and column is not None:
                body = handle.read(body_length)
                if len(body) != body_length:
                    raise PreparedDataError("%s: cut short in a record batch's body" % path)
                yield metadata, header, body
                continue
            if header_type == RECORD_BATCH:
                yield metadata, header, None
            handle.seek(body_length, os.SEEK_CUR)


#: Arrow buffers per datasets feature (the IPC format's layouts): a primitive value its validity and data,
#: a string or binary value also its offsets, a list its validity and offsets before its child's.
VALUE_BUFFERS = {"string": 3, "large_string": 3, "binary": 3, "large_binary": 3}
LIST_TYPES = {"List": 4, "Sequence": 4, "LargeList": 8}  # the width of the offsets, in bytes


def _buffer_count(feature):
    if isinstance(feature, dict) and feature.get("_type") == "Value":
        return VALUE_BUFFERS.get(feature.get("dtype"), 2)
    if isinstance(feature, dict) and feature.get("_type") in LIST_TYPES:
        return 2 + _buffer_count(feature.get("feature"))
    raise PreparedDataError("a feature this reader does not walk: %r" % (feature,))


def _input_ids_buffers(directory):
    """(index of input_ids' offsets buffer in a record batch, the offsets' width): the features of
    dataset_info.json, in column order, each taking its buffers."""
    try:
        with open(os.path.join(directory, "dataset_info.json")) as handle:
            features = json.load(handle)["features"]
    except (OSError, ValueError, KeyError) as exc:
        raise PreparedDataError("%s: no features in dataset_info.json (%s)" % (directory, exc)) from None
    first = 0
    for name, feature in features.items():
        if name == "input_ids":
            if feature.get("_type") not in LIST_TYPES:
                raise PreparedDataError("%s: input_ids is %r, not a list" % (directory, feature.get("_type")))
            return first + 1, LIST_TYPES[feature["_type"]]
        first += _buffer_count(feature)
    raise PreparedDataError("%s: no input_ids column (features: %s)" % (directory, ", ".join(features)))


def _list_lengths(metadata, header, body, column, path):
    """The lengths of the lists in one record batch: differences of the offsets buffer `column` names."""
    index, width = column
    rows = _long_field(metadata, header, 0) or 0
    position, fields = _table(metadata, header)
    if _field(fields, 3):
        raise PreparedDataError("%s: a compressed record batch" % path)
    at = position + _field(fields, 2)
    vector = at + struct.unpack_from("<I", metadata, at)[0]
    if index >= struct.unpack_from("<I", metadata, vector)[0]:
        raise PreparedDataError("%s: a record batch with fewer buffers than its features name" % path)
    offset, length = struct.unpack_from("<qq", metadata, vector + 4 + 16 * index)
    if rows == 0:
        return []
    if length < (rows + 1) * width or offset + length > len(body):
        raise PreparedDataError("%s: input_ids' offsets do not fit its record batch" % path)
    offsets = struct.unpack_from("<%d%s" % (rows + 1, "i" if width == 4 else "q"), body, offset)
    return [end - start for start, end in zip(offsets, offsets[1:])]


def _read_int32(handle, path):
    raw = handle.read(4)
    if not raw:
        return 0  # end of file without the end-of-stream marker: what was read is whole
    if len(raw) != 4:
        raise PreparedDataError("%s: cut short in a message's size" % path)
    return struct.unpack("<i", raw)[0]


def _table(buffer, position):
    """(table position, its vtable's field offsets) of the flatbuffer table at `position`."""
    vtable = position - struct.unpack_from("<i", buffer, position)[0]
    vtable_size = struct.unpack_from("<H", buffer, vtable)[0]
    fields = struct.unpack_from("<%dH" % ((vtable_size - 4) // 2), buffer, vtable + 4)
    return position, fields


def _field(fields, number):
    return fields[number] if number < len(fields) else 0


def _message(buffer, path):
    """(header_type, position of the header table, bodyLength) of a `Message`."""
    try:
        root = struct.unpack_from("<I", buffer, 0)[0]
        position, fields = _table(buffer, root)
        type_at, header_at, body_at = _field(fields, 1), _field(fields, 2), _field(fields, 3)
        header_type = buffer[position + type_at] if type_at else 0
        header = None
        if header_at:
            offset_at = position + header_at
            header = offset_at + struct.unpack_from("<I", buffer, offset_at)[0]
        body_length = struct.unpack_from("<q", buffer, position + body_at)[0] if body_at else 0
    except (struct.error, IndexError):
        raise PreparedDataError("%s: a message's metadata is not an Arrow Message" % path) from None
    return header_type, header, body_length


def _long_field(buffer, table, number):
    position, fields = _table(buffer, table)
    at = _field(fields, number)
    return struct.unpack_from("<q", buffer, position + at)[0] if at else None


# -- which of the rows a share writes -----------------------------------------------------------------

def client_ranks(world_size, rank, clients):
    """(the world size, this share's ranks) its `clients` processes pass to generate-offline-data."""
    world_size, rank = world_size or 1, rank or 0
    return world_size * clients, [rank * clients + k for k in range(clients)]


def shard_indices(num_samples, max_samples=None, world_size=1, rank=0, clients=1):
    """The global sample indices this share writes: rank `rank` of `world_size`, its `clients` processes'
    ranks together (client_ranks), as generate-offline-data splits them (speculators 0.9.0
    data_generation/offline.py get_indices_to_process, 0.8.x the same): target = min(max_samples, N)
    samples in contiguous chunks, the first `target % world` ranks one longer."""
    target = num_samples if max_samples is None else min(max_samples, num_samples)
    if target <= 0:
        return []
    world, ranks = client_ranks(world_size, rank, clients or 1)
    chunk, remainder = divmod(target, world)
    return [index for sub_rank in ranks
            for index in range(sub_rank * chunk + min(sub_rank, remainder),
                               sub_rank * chunk + min(sub_rank, remainder) + chunk + (sub_rank < remainder))]
