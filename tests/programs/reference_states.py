"""transformers' own residual stream for a sample, computed once per model, libraries and token ids.

    ReferenceStates(model_dir).of(token_ids) -> tensor [L + 1, seq, hidden], the model's dtype: [0] the
    embeddings, [i + 1] the output of decoder layer i, before the final norm (forward hooks: the last
    entry of transformers' `hidden_states` is taken after the norm).

Every lab test that checks extracted states runs the tiny model over the same rows of the same dataset
(in bf16 on a CPU without bf16 units: about 0.3 s a row), so the answer of one is the answer of all. Each
row's states are kept in CACHE under a key of everything that decides them: the model directory's files
(name, size, mtime_ns), torch's and transformers' versions (the in-process and the server venvs hold
different ones), the dtype and the token ids. The model is loaded only for a row not kept yet. Files are
written whole (renamed into place): the suite's two processes share the directory.
"""
import hashlib
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CACHE = Path(os.environ.get("SPECRIG_REFERENCE_CACHE", "/tmp/specrig-tests-reference-states"))
DTYPE = torch.bfloat16


def _fingerprint(model_dir: Path) -> bytes:
    import transformers

    digest = hashlib.sha256()
    for path in sorted(model_dir.rglob("*")):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.relative_to(model_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    digest.update(f"torch {torch.__version__} transformers {transformers.__version__} {DTYPE}".encode())
    return digest.digest()


class ReferenceStates:
    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)
        self._fingerprint = _fingerprint(self.model_dir)
        self._model = None
        self._outputs = {}

    def of(self, token_ids: torch.Tensor) -> torch.Tensor:
        ids = token_ids.to(torch.int64).contiguous()
        path = CACHE / (hashlib.sha256(self._fingerprint + ids.numpy().tobytes()).hexdigest() + ".safetensors")
        if path.exists():
            return load_file(str(path))["states"]
        states = self._forward(ids)
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        save_file({"states": states.contiguous()}, str(partial))
        os.replace(partial, path)
        return states

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=DTYPE).eval()
            self._model.model.embed_tokens.register_forward_hook(
                lambda module, inputs, output: self._outputs.__setitem__(0, output.detach()))
            for i, layer in enumerate(self._model.model.layers):
                layer.register_forward_hook(lambda module, inputs, output, i=i: self._outputs.__setitem__(
                    i + 1, (output[0] if isinstance(output, tuple) else output).detach()))
        with torch.no_grad():
            self._model(ids[None])
        return torch.stack([self._outputs[i][0] for i in range(len(self._model.model.layers) + 1)])
