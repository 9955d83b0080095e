"""Make KimiK25ForConditionalGeneration implement SupportsEagle3, delegating to its language model.

speculators' worker extension refuses a model unless vLLM's supports_eagle3()
holds: the class must derive from SupportsEagle3 and have both auxiliary
hidden-state methods. Kimi-K2.5 keeps its text model in `language_model`, so
the methods delegate there, as vLLM's Llama4ForConditionalGeneration does.
"""
from patching import patchlib

CLASS = "KimiK25ForConditionalGeneration"
INTERFACE = "SupportsEagle3"
MEMBERS = '''
def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
    # Added by specrig (patch kimi-k25-supports-eagle3): the text model owns the layers.
    self.language_model.set_aux_hidden_state_layers(layers)

def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
    # Added by specrig (patch kimi-k25-supports-eagle3).
    return self.language_model.get_eagle3_aux_hidden_state_layers()
'''
METHODS = ("set_aux_hidden_state_layers", "get_eagle3_aux_hidden_state_layers")


def state(source):
    return patchlib.class_members_state(source, CLASS, METHODS, base=INTERFACE)


def apply(source):
    return patchlib.add_to_class(source, CLASS, MEMBERS, base=INTERFACE,
                                 import_from="vllm.model_executor.models.interfaces")
