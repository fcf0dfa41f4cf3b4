"""Count the bytes of tensor storage a piece of code allocates, on any device.

``torch.cuda.max_memory_allocated`` answers "how much did the tensors take at the
peak" on a GPU only. This gives the same answer on the CPU, so the memory
estimator (gpt2/estimates/memory.py) is checked by tests on any machine: a torch
dispatch mode sees every tensor an operator returns, counts each new storage once,
and a weak reference notices when the storage is freed. Storages that existed
before (parameters, inputs, and views of them) are not counted.

    with TensorMemory() as mem:
        loss = model(x, y)[1]
        loss.backward()
    mem.peak, mem.current   # bytes
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorMemory(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self._live: dict[int, weakref.ref] = {}
        self.current = 0
        self.peak = 0

    def _freed(self, key: int, nbytes: int) -> None:
        if self._live.pop(key, None) is not None:
            self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._live:
                continue  # a view, an in-place result, or already counted
            self._live[key] = weakref.ref(
                storage, lambda _ref, key=key, nbytes=nbytes: self._freed(key, nbytes))
            self.current += nbytes
            self.peak = max(self.peak, self.current)
        return out
