"""Calling the tuned kernels from PyTorch: the pieces behind :mod:`fa2tune.torch`.

* :mod:`fa2tune.ops.choice`: which config serves a call, dense or a packed batch (one rule,
  the call's mode a field of it), the argument rules and decision key of packed batches
  (torch-free, so it is testable and importable on any machine);
* :mod:`fa2tune.ops.remote`: asking a running fa2tune service instead (torch-free);
* :mod:`fa2tune.ops.autotune`: tuning untuned shapes on first use (torch-free);
* :mod:`fa2tune.ops.selection`: the sources in order for one call (torch-free);
* :mod:`fa2tune.ops.kernels`: building and loading a chosen config once per process and
  device, and the launchers of one decision (imports torch);
* :mod:`fa2tune.ops.workspace`: split-KV's workspace (imports torch);
* :mod:`fa2tune.ops.fallback`: the op's semantics on torch alone (imports torch);
* :mod:`fa2tune.ops.torch_op`: the ``torch.ops.fa2tune.attention`` and ``attention_varlen``
  custom ops, one call path for both, and their fake implementations (imports torch).

Nothing is imported here: ``import fa2tune.ops`` never needs torch.
"""

from __future__ import annotations
