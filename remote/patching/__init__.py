"""The patch stage, host half: the engine (patch.py), patchsets (patchset.py), data edits (edits.py), backups and the manifest (store.py). Patchset scripts import the top-level patchlib."""
