"""The server mode's contract (speculators >= 0.8): what specrig's launch and speculators' client rely on
in a `vllm serve` running the extract_hidden_states method, checked against the installed vLLM's source.

docs/server-mode.md (section 10, points C1-C20) says what each point is and where it lives in the
releases read so far; docs/findings.md lists the ids. Standard library only; sources are read with
`ast`, never imported (specrig's own remote/base/server_command.py is imported: it is specrig's code,
and the values it sends are what is checked).

    points.py     POINTS, the table: each point, who relies on it, the points it needs first, its
                  check; analyze_server(), which runs the table into the report
    context.py    what a check is given (Context: both sides' source) and answers (Problems, or Skip
                  when the question does not arise: no model given, a CPU-only point on a GPU build)
    method.py     the checks of the extract_hidden_states method: its name, config, proposer
    connector.py  the checks of the KV connector that writes the states
    endpoints.py  the checks of the HTTP API: the completion protocol, the render endpoint, health
    commands.py   the checks of the command lines: server flags, speculators' CLI options, entry point
    target.py     the checks of the target model's classes: the last layer, SupportsEagle3

Each Problem a check returns becomes one finding (drift.findings.ServerContract), with the vLLM file:line.
"""
