from fa2tune.flash_attn import *  # noqa: F403  (FlashAttention-3 tests import flash_attn_interface)
