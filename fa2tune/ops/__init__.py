"""Calling the tuned kernels from PyTorch: the pieces behind :mod:`fa2tune.torch`.

* :mod:`fa2tune.ops.choice`: which config serves a call (torch-free, so it is testable and
  importable on any machine);
* :mod:`fa2tune.ops.remote`: asking a running fa2tune service instead (torch-free);
* :mod:`fa2tune.ops.autotune`: tuning untuned shapes on first use (torch-free);
* :mod:`fa2tune.ops.selection`: the sources in order for one call shape (torch-free);
* :mod:`fa2tune.ops.kernels`: building and loading a chosen config once per process and
  device, and the launch of one call (imports torch);
* :mod:`fa2tune.ops.torch_op`: the ``torch.ops.fa2tune.attention`` custom op, its fake
  implementation and the SDPA fallback (imports torch);
* :mod:`fa2tune.ops.varlen_choice`: packed variable-length batches: the decision key, the
  argument rules and the varlen config choice (torch-free);
* :mod:`fa2tune.ops.varlen_op`: the ``torch.ops.fa2tune.attention_varlen`` custom op, its
  launcher and its fallback (imports torch).

Nothing is imported here: ``import fa2tune.ops`` never needs torch.
"""

from __future__ import annotations
