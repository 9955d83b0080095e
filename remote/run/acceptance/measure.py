"""The acceptance measurement's program, run by its supervisor (run/acceptance/workload.py):

    <python> measure.py RUN_DIR                   the steps, stdlib only: the untrained draft made (an "auto"
                                                  one, with the host's speculators), then each draft not yet
                                                  measured, each in a process of its own (below)
    <server_python> measure.py RUN_DIR --draft NAME
                                                  one draft measured: vLLM serves the target with it (EAGLE-3,
                                                  greedy) on the plan's prompts; its counters written whole to
                                                  acceptance/NAME.json

Each draft gets a fresh engine: vLLM's counters start at zero, and a crash loses only that draft's measurement
(a restart measures only what is missing). The heartbeat (heartbeat.json in the run) says the phase:
untrained-draft, loading, measuring (which draft, prompts done).
"""
import json
import os
import shutil
import subprocess
import sys
import time

# The run's code/ (this file is code/run/acceptance/measure.py): the ground's modules, as every program of a run.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from base import atomic

PHASE_UNTRAINED = "untrained-draft"
PHASE_LOADING = "loading"
PHASE_MEASURING = "measuring"
#: The untrained draft is made in <path>.making and renamed whole: a restart never takes half a draft for one.
MAKING = ".making"
#: Prompts per generate() call: the heartbeat counts them between calls.
PROMPTS_PER_CALL = 8
#: vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py, the same names in vLLM 0.10 to 0.32).
METRICS = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
           "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: The roles of a conversation's turns, in the dataset formats the extraction reads.
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def beat(run_dir, **fields):
    atomic.write_json(os.path.join(run_dir, "heartbeat.json"), dict(fields, at=time.time()))


def read_plan(run_dir):
    with open(os.path.join(run_dir, "run.json")) as handle:
        return json.load(handle)["accept"]


# -- the steps (stdlib) -------------------------------------------------------------------------

def steps(run_dir):
    """The untrained draft made where it is missing, then every draft not yet measured; the first failing
    step's exit status."""
    plan = read_plan(run_dir)
    untrained = plan["untrained"]
    if untrained["source"] == "auto" and not os.path.isdir(untrained["path"]):
        beat(run_dir, phase=PHASE_UNTRAINED, draft="untrained")
        making = untrained["path"] + MAKING
        shutil.rmtree(making, ignore_errors=True)  # what an attempt ended mid-save left
        print("making the untrained draft: %s" % " ".join(untrained["argv"]), flush=True)
        status = subprocess.call(untrained["argv"], stdin=subprocess.DEVNULL)
        if status != 0:
            print("the untrained draft's `speculators train --dry-run` exited with %d" % status, flush=True)
            return status
        os.rename(making, untrained["path"])
    drafts = ["trained"] + ([] if untrained["source"] == "none" else ["untrained"])
    for name in drafts:
        if os.path.isfile(os.path.join(plan["results"], name + ".json")):
            print("the %s draft is measured already" % name, flush=True)
            continue
        status = subprocess.call([plan["measure_python"], os.path.abspath(__file__), run_dir, "--draft", name],
                                 stdin=subprocess.DEVNULL)
        if status != 0:
            print("measuring the %s draft exited with %d" % (name, status), flush=True)
            return status
    return 0


# -- one draft measured (vLLM) ------------------------------------------------------------------

def conversations(path, first_row, count):
    """The prompts: rows first_row .. first_row+count-1 of a jsonl of conversations, each its turns up to the
    first assistant turn (what the target answers)."""
    prompts = []
    with open(path) as handle:
        rows = (line for line in handle if line.strip())
        for index, line in enumerate(rows):
            if index < first_row:
                continue
            if len(prompts) == count:
                break
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise SystemExit("%s row %d is no JSON (%s): fix the row or pass another --first-row"
                                 % (path, index, exc)) from None
            prompts.append(turns(row, path, index))
    return prompts


def turns(row, path, index):
    messages = []
    for turn in row.get("conversations") or row.get("messages") or []:
        role = ROLES.get(turn.get("from") or turn.get("role"))
        if role == "assistant":
            break
        if role:
            messages.append({"role": role, "content": turn.get("value") or turn.get("content") or ""})
    if not messages:
        raise SystemExit("%s row %d holds no user turn (conversations/messages): fix the row or pass another "
                         "--first-row" % (path, index))
    return messages


def as_text(tokenizer, messages):
    """The prompt as the target reads it: its chat template where it has one, else the turns' text."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n".join(message["content"] for message in messages)


def counters(metrics):
    """The spec-decode counters of llm.get_metrics() (Counter.value, Vector.values), summed over the engines
    (data parallel: one labelled series each); SystemExit when vLLM reported none (a draft it did not use)."""
    found, per_position = {}, None
    for metric in metrics:
        if metric.name in METRICS:
            key = METRICS[metric.name]
            found[key] = found.get(key, 0) + int(metric.value)
        elif metric.name == PER_POSITION:
            values = [int(value) for value in metric.values]
            summed = per_position or []
            width = max(len(summed), len(values))
            per_position = [(summed[i] if i < len(summed) else 0) + (values[i] if i < len(values) else 0)
                            for i in range(width)]
    missing = sorted(set(METRICS.values()) - set(found)) + ([] if per_position is not None else [PER_POSITION])
    if missing:
        raise SystemExit("vLLM reported no spec-decode metrics %s: the draft was not used for speculative "
                         "decoding" % ", ".join(missing))
    return dict(found, accepted_per_position=per_position)


def measure(run_dir, name):
    plan = read_plan(run_dir)
    draft = plan["draft"] if name == "trained" else plan["untrained"]["path"]
    beat(run_dir, phase=PHASE_LOADING, draft=name)
    # The prompts first: a bad row ends the measurement before an engine is loaded for nothing.
    conversed = conversations(plan["prompts"], plan["first_row"], plan["num_prompts"])
    import vllm
    from vllm import LLM, SamplingParams

    # Eager: no compile or graph capture to wait for; the tokens, and so the acceptance, are the same.
    llm = LLM(model=plan["model"], tensor_parallel_size=plan["tp"], enforce_eager=True, disable_log_stats=False,
              seed=0, speculative_config={"method": "eagle3", "model": draft,
                                          "num_speculative_tokens": plan["k"]})
    tokenizer = llm.get_tokenizer()
    prompts = [as_text(tokenizer, messages) for messages in conversed]
    greedy = SamplingParams(temperature=0.0, max_tokens=plan["max_tokens"])
    generated = 0
    for start in range(0, len(prompts), PROMPTS_PER_CALL):
        beat(run_dir, phase=PHASE_MEASURING, draft=name, prompts_done=start, prompts_total=len(prompts))
        outputs = llm.generate(prompts[start:start + PROMPTS_PER_CALL], greedy, use_tqdm=False)
        generated += sum(len(output.outputs[0].token_ids) for output in outputs)
    beat(run_dir, phase=PHASE_MEASURING, draft=name, prompts_done=len(prompts), prompts_total=len(prompts))
    found = counters(llm.get_metrics())
    os.makedirs(plan["results"], exist_ok=True)
    atomic.write_json(os.path.join(plan["results"], name + ".json"), dict(
        found, draft=draft, model=plan["model"], k=plan["k"], prompts=len(prompts), generated_tokens=generated,
        first_row=plan["first_row"], max_tokens=plan["max_tokens"], vllm=vllm.__version__))
    print("measured the %s draft: %d drafts, %d of %d drafted tokens accepted" % (
        name, found["num_drafts"], found["num_accepted_tokens"], found["num_draft_tokens"]), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--draft":
        sys.exit(measure(sys.argv[1], sys.argv[3]))
    sys.exit(steps(sys.argv[1]))
