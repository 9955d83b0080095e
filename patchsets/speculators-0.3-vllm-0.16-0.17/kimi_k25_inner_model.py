"""Give KimiK25ForConditionalGeneration a `model` property: its language model's inner model.

speculators' worker extension captures hidden states by replacing
`model.model.forward`; Kimi-K2.5 keeps that module at `language_model.model`.
A read-only property (not a submodule) changes no weight names.
"""
from patching import patchlib

CLASS = "KimiK25ForConditionalGeneration"
MEMBERS = '''
@property
def model(self):
    # Added by specrig (patch kimi-k25-inner-model): speculators patches model.model.forward.
    return self.language_model.model
'''


def state(source):
    return patchlib.class_members_state(source, CLASS, ("model",))


def apply(source):
    return patchlib.add_to_class(source, CLASS, MEMBERS)
