// A template whose parameter check fails, like an invalid fa2::Traits instantiation.
template <int Br, int Warps>
struct Traits {
  static_assert(Br % (16 * Warps) == 0, "each warp needs whole 16-row mma tiles");
  static constexpr int kRows = Br / Warps;
};
template <class T>
__global__ void k(float* o) { o[threadIdx.x] = T::kRows; }
template __global__ void k<Traits<32, 4>>(float*);
