// The "avx512vnni" kernel variant: AVX-512 F/BW/VL/DQ + VNNI (vpdpbusd). Bodies in kernels_avx512_impl.h.
#include "backend/cpu/kernels.h"

#if defined(__x86_64__)
#define BONSAI_AVX512_VNNI 1
#include "backend/cpu/kernels_avx512_impl.h"

namespace bonsai::cpu::detail {
const Kernels* avx512vnni_kernels() {
  static const Kernels k{"avx512vnni",           fwht_block_avx512,       ternary_rows_x1_avx512,
                         ternary_rows_xm_avx512, dot_avx512,              quantize_q8_avx512,
                         ternary_rows_q8_x1_avx512, ternary_rows_q8_xm_avx512,
                         ternary_tiles_q8_x1_avx512, ternary_tiles_q8_xm_avx512};
  return &k;
}
}  // namespace bonsai::cpu::detail
#else
namespace bonsai::cpu::detail {
const Kernels* avx512vnni_kernels() { return nullptr; }
}  // namespace bonsai::cpu::detail
#endif
