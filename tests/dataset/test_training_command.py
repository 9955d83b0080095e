"""remote/dataset/command.py: which trainer a speculators release has, the command that fits an output, and
each refusal as one line naming its fix."""
from __future__ import annotations

import pytest

from dataset import command

LAYERS = [2, 16, 29, 32]
NONE_ASKED = dict(backend=None, target_layer_ids=None, stray_samples=[])


def refusals(**given):
    settings = dict(file_format=command.SAFETENSORS, trainer=command.ARROW_TRAINER, storage="bf16", slots=4,
                    layer_ids=LAYERS, num_hidden_layers=32, **NONE_ASKED)
    return command.refusals(**dict(settings, **given))


@pytest.mark.parametrize(("version", "trainer"), [
    ("0.3.0", command.SCRIPT_TRAINER), ("0.4.0.1", command.SCRIPT_TRAINER), ("0.6.0", None),
    ("0.8.0", command.ARROW_TRAINER), ("0.9.0", command.ARROW_TRAINER), ("0.10.0.dev3", command.ARROW_TRAINER),
    (None, None)])
def test_the_trainer_of_a_release(version, trainer):
    assert command.trainer_of(version) == trainer


def test_an_output_the_trainer_reads_as_it_is_is_not_refused():
    assert refusals() == []
    assert refusals(storage="fp8", backend="fp8", target_layer_ids=[2, 16, 29]) == []
    assert refusals(file_format=command.PT, trainer=command.SCRIPT_TRAINER, num_hidden_layers=None) == []


def test_each_refusal_is_one_line_with_its_fix():
    assert refusals(file_format=command.PT) == [
        "data_{i}.pt files are the output of speculators 0.3-0.4, which `speculators train` (0.8+) cannot read: "
        "train them with 0.3-0.4's scripts/train.py, or extract again on this host (server mode writes "
        "hs_{i}.safetensors)"]
    assert refusals(storage="fp8", backend="file") == [
        "--hidden-states-backend 'file' with fp8 files: the 'file' backend casts fp8 states without their scales "
        "(wrong values, no error): use --hidden-states-backend fp8"]
    assert refusals(target_layer_ids=[2, 16]) == [
        "--target-layer-ids 2 16 do not match the files, which hold layers [2, 16, 29, 32] (the last one the "
        "verifier's output): pass --target-layer-ids 2 16 29"]
    assert refusals(file_format=command.PT, trainer=command.SCRIPT_TRAINER, num_hidden_layers=None,
                    stray_samples=["/o/token_freq.pt"]) == [
        "/o/token_freq.pt lies inside the data path, where scripts/train.py takes every file ending in 'pt' for a "
        "sample: move it out (keep it for the vocabulary mapping)"]
    assert refusals(layer_ids=[2, 16, 29, 31]) == [
        "the files' last slot is layer 31, where the trainer takes the last slot for the verifier's last layer "
        "(32): extract again with layer ids ending in 32"]
    assert refusals(file_format=command.PT, trainer=command.SCRIPT_TRAINER, num_hidden_layers=None, slots=5,
                    layer_ids=[2, 8, 16, 29, 32])[0].startswith("the files hold 4 target layer(s)")


def test_the_command_names_the_files_layers_and_backend():
    vocab = {"options": [], "present": [], "note": None}
    words = command.training_command(trainer=command.ARROW_TRAINER, model="/m", data_path="/d",
                                     hidden_states_path="/h", layer_ids=LAYERS, storage="fp8", save_path="/s",
                                     vocab=vocab)
    assert words == ["speculators", "train", "--verifier-name-or-path", "/m", "--data-path", "/d",
                     "--hidden-states-path", "/h", "--target-layer-ids", "2", "16", "29",
                     "--hidden-states-backend", "fp8", "--on-missing", "raise", "--save-path", "/s"]
    words = command.training_command(trainer=command.SCRIPT_TRAINER, model="/m", data_path=None,
                                     hidden_states_path="/h", layer_ids=LAYERS, storage="bf16", save_path="/s",
                                     vocab={"options": ["--d2t-path", "/h/d2t.npy", "--t2d-path", "/h/t2d.npy"]})
    assert words == ["python", "scripts/train.py", "--verifier-name-or-path", "/m", "--data-path", "/h",
                     "--d2t-path", "/h/d2t.npy", "--t2d-path", "/h/t2d.npy", "--save-path", "/s"]
    assert command.shell_line(["a b", "it's", "--x=1"]) == "'a b' 'it'\\''s' --x=1"


def test_the_vocabulary_files_are_present_or_named(tmp_path):
    assert command.vocabulary(str(tmp_path), command.SAFETENSORS, str(tmp_path))["note"].startswith(
        "no token_freq.pt nor d2t/t2d in the data path")
    (tmp_path / "token_freq.pt").write_bytes(b"")
    assert "add --draft-vocab-size N" in command.vocabulary(str(tmp_path), command.SAFETENSORS, str(tmp_path))["note"]
    (tmp_path / "d2t-32000.npy").write_bytes(b"")
    (tmp_path / "t2d-32000.npy").write_bytes(b"")
    assert command.vocabulary(str(tmp_path), command.SAFETENSORS, str(tmp_path))["options"] == [
        "--draft-vocab-size", "32000"]


@pytest.mark.parametrize(("speculators", "torch", "env"), [
    ("0.9.0", "2.11.0+cu130", [command.NO_DYNAMO]),  # the H200's pair: the compile of the fused loss stops
    ("0.9.0", "2.9.1", []), ("0.9.0", "2.13.0+cpu", []), ("0.8.1", "2.11.0", []), ("0.9.0", None, []),
    (None, "2.11.0", [])])
def test_the_command_runs_with_dynamo_off_where_the_trainer_fails_to_compile(speculators, torch, env):
    trainer = command.trainer_of(speculators)
    found, notes = command.environment(trainer=trainer, speculators=speculators, torch=torch)
    assert found == env and len(notes) == len(env)
    if env:
        assert "TORCHDYNAMO_DISABLE=1" in notes[0] and "--total-seq-len" in notes[0]
        words = command.training_command(trainer=trainer, model="/m", data_path="/d", hidden_states_path="/h",
                                          layer_ids=LAYERS, storage="bf16", save_path="/s",
                                          vocab={"options": []}, env=found)
        assert words[:4] == ["env", "TORCHDYNAMO_DISABLE=1", "speculators", "train"]
