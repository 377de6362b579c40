"""The GPU-measurement stage: verify and time one built kernel on one problem, in isolation.

:mod:`measure.worker` runs a child process per GPU (:mod:`measure.child`) that owns the CUDA
context, so a hang or a trap costs one job, never the caller. Inside it,
:mod:`measure.handler` loads the cubin (:mod:`measure.loader`), builds inputs and the float32
reference (:mod:`measure.reference`), checks the output (:mod:`measure.verify`) and times
launches (:mod:`measure.timing`, :mod:`measure.sdpa`). :mod:`measure.bench` is ``fa2tune
bench``. This package imports :mod:`core` and :mod:`codegen`, never :mod:`tuner`, :mod:`db` or
:mod:`service`; torch and cuda-bindings are imported only where a GPU is used.
"""
