// Runtime selection of the CPU kernel variant. Today only the portable variant exists; a SIMD variant
// is added here as: if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kAvx2;
#include "backend/cpu/kernels.h"

namespace bonsai::cpu {

const Kernels& kernels() {
  static const Kernels& chosen = portable_kernels();
  return chosen;
}

}  // namespace bonsai::cpu
