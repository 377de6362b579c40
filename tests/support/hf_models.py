"""Two transformers Llama models of one config with the same weights: one on fa2tune's
attention (``fa2tune.integrations.transformers``), one on transformers' SDPA."""

from __future__ import annotations

import copy
from typing import Any


def paired_llamas(config: Any) -> tuple[Any, Any]:
    """``(fa2tune's, sdpa's)`` for ``config``, random weights from torch's current seed.

    Each model gets its own copy of the config: transformers sets the implementation on it.
    """
    import transformers

    from fa2tune.integrations import transformers as fa2tune_hf

    name = fa2tune_hf.register()
    make = transformers.LlamaForCausalLM._from_config
    ours = make(copy.deepcopy(config), attn_implementation=name)
    sdpa = make(copy.deepcopy(config), attn_implementation="sdpa")
    sdpa.load_state_dict(ours.state_dict())
    return ours, sdpa
