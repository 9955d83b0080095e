"""The disk budget of a host's share (stdlib only): the bytes its hidden states take against the free
space where they go. One sizing, two sources of tokens: the preflight estimates them from the dataset
(run/preflight.py, before anything runs); a resume, and each attempt before its first file, read the
prepared data's real token counts (base/prepared.py token_counts) for the samples of its share
still missing.

The bytes a token takes are the run's storage's, from one definition (contract.stored_bytes_per_token:
bf16 the model's dtype, fp8 one byte a value and a float32 scale a token).
"""

from base import contract, outputs, prepared
from base.units import human_bytes
from run import disk_watch
from run import storage as storage_path
from run.server import client

#: Room beyond the states themselves: the files' headers and token ids, the filesystem's blocks.
DISK_MARGIN = 1.1


def room(directory, *, need, what, fix):
    """{ok, detail, advice, need, free, where}: `need` bytes (`what` says for what) against the free space
    at `directory` (or its nearest existing parent); `fix` finishes the advice."""
    where = storage_path.existing_parent(directory)
    free = disk_watch.free_bytes(where)
    need = int(need * DISK_MARGIN)
    return {"ok": free >= need, "need": need, "free": free, "where": where,
            "detail": "%s free at %s; %s needs about %s" % (human_bytes(free), where, what, human_bytes(need)),
            "advice": None if free >= need else "free %s at %s, %s" % (human_bytes(need - free), where, fix)}


def share_room(plan, *, fix):
    """A server-mode run's room for the files of its share still missing (room()), from the real token
    counts of its prepared data: before a resume starts anything, and in each attempt once prepare-data
    has counted them; None when there is no prepared data yet (nothing to size but the preflight's
    estimate)."""
    try:
        counts = prepared.token_counts(plan["prepared"])
    except (OSError, prepared.PreparedDataError):
        return None
    share = client.plan_share(plan, len(counts))
    present = set(outputs.existing_indices(plan["out"]))
    missing = [index for index in share if index not in present]
    # The served targets are bf16 (the plan records no dtype): a bf16 file holds 2 bytes a value.
    per_token = contract.stored_bytes_per_token(plan.get("storage") or contract.BF16,
                                                values_per_token=plan["hidden_size"] * len(plan["layer_ids"]),
                                                model_dtype_bytes=2)
    tokens = sum(counts[index] for index in missing)
    what = "the %d missing sample(s) of its %d (%d B/token x %d tokens, the prepared data's own)" % (
        len(missing), len(share), per_token, tokens)
    return room(plan["out"], need=per_token * tokens, what=what, fix=fix)
