// fa2tune NVRTC shim of <cuda.h> (see README.md): the TMA descriptor type only.
#pragma once
typedef struct CUtensorMap_st {
  alignas(128) unsigned long long opaque[16];
} CUtensorMap;
