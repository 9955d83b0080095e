"""Where huggingface_hub itself finds a model in its cache, offline: the reference for remote/base/hfcache.py.

    <python of a lab venv> tests/programs/hub_snapshot.py REPO_ID REVISION

Prints one JSON line: {"version", "path"} (the snapshot directory), or {"version", "error"} (the
exception's class) when the cache does not hold it. The cache is what this process's environment
says (HF_HOME, HF_HUB_CACHE, ...): huggingface_hub reads it once, at import.
"""
import json
import sys


def main(repo_id, revision):
    import huggingface_hub

    try:
        path = huggingface_hub.snapshot_download(repo_id, revision=revision, local_files_only=True)
    except Exception as exc:  # the kind of failure is the answer
        print(json.dumps({"version": huggingface_hub.__version__, "error": type(exc).__name__}))
        return
    print(json.dumps({"version": huggingface_hub.__version__, "path": path}))


if __name__ == "__main__":
    main(*sys.argv[1:])
