"""The extraction driver's parts; the program is remote/run/extract_driver.py (started by path).

arguments   args.json: read, checked, completed (Refused, Locked)
heartbeat   the progress file
output      the output directory: lock, temporaries, resume scan, the sample writer, disk full
model       the derived model directory (hf_overrides), visible GPUs, speculators' generator
extraction  the run: preprocessing, resume settings, data_config.json, the generate/write loop

Every module imports only the standard library at its top: vLLM's spawned workers re-import the
program, and torch, vLLM and speculators load inside functions.
"""
