// fa2tune: pre-included in NVRTC builds (see README.md): what NVRTC's front end lacks.
#pragma once
#define __builtin_huge_valf() __builtin_bit_cast(float, 0x7f800000u)
