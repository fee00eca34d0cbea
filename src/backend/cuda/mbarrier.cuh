// Shared-memory mbarriers (sm_90) and the copies that complete on them, shared by the kernels that stream through a
// shared-memory ring: GEMM v3 (gemm_ws.cu), the batched wgmma product (matvec_wgmma_batch.cu), matvec v4 (matvec_bulk.cu)
// and v7 (matvec_mma.cu). nvcc only. A barrier is named by its shared-memory address (u32) or by a pointer to its
// 8 bytes; both forms emit the same instructions.
#pragma once
#include <cstdint>

namespace bonsai::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// One arrival that also expects `bytes` more of transaction (bulk copies completing on this barrier).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!ok);
}
// One arrival on bar once all of this thread's earlier cp.async copies have landed (counted in the init).
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// The same without .noinc: the barrier's pending count goes up by one now and down by one once this thread's earlier
// cp.async copies have landed, so a phase counted for ONE arrival (ffn_fused's ring) also waits for every lane's copies
// when lane 0 arrives after the warp's calls (round 33).
__device__ __forceinline__ void cp_async_arrive_inc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
// A 2-D tensor-map copy (a box of rows of a strided matrix, round 33: ffn_fused's ffn_down chunk), completion counted in
// bytes on bar (the whole box, out-of-range rows included). tmap: a CUtensorMap in param (__grid_constant__), const or
// global memory; c0 the inner (element) coordinate, c1 the row; dst 128-byte aligned.
__device__ __forceinline__ void tensor_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// global -> shared bulk copy, completion counted in bytes on bar; dst, src 16-byte aligned, bytes % 16 == 0.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, unsigned bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// The same through pointers.
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) { mbar_init(smem_u32(bar), count); }
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_u32(bar)); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, unsigned bytes) { mbar_expect_tx(smem_u32(bar), bytes); }
// The pointer form spins inside one asm block, the address form above in C++ around one try_wait: each is what its
// kernels (v4 / v7 here, GEMM v3 / the batched wgmma there) were measured with, and this header leaves every kernel's
// SASS as it was. Unify them after a device A/B.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra MBAR_WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  bulk_load(smem_u32(dst), src, bytes, smem_u32(bar));
}

}  // namespace bonsai::cuda
