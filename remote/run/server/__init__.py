"""Server-mode extraction (speculators >= 0.8), host half, standard library only.

speculators 0.8 and newer no longer drive vLLM in process: a vLLM server runs with the
`extract_hidden_states` speculative method and a hidden-states KV connector, and speculators' CLI
(`prepare-data`, `generate-offline-data`) talks to it over HTTP. See docs/server-mode.md.

    launch.py   the server's argv, built as speculators' scripts/launch_vllm.py builds it
    outputs.py  validation of the `hs_{i}.safetensors` files without torch: header, shapes,
                truncation, NaN/Inf
"""
