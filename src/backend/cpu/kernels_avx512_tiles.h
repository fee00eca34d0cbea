// AVX-512 integer kernels on the tiled layout (backend/cpu/tiles.h). Included by kernels_avx512_impl.h only,
// inside its namespace, after the canonical GEMM (whose gemm16_chunk / decode_planes the tiled GEMM reuses).
//
// Matvec (M = 1), the decode workhorse: the lanes are 16 ROWS, as in the GEMM, but with no transpose (the
// tiles are stored transposed) and no per-row scale work (16 rows' d are one fp16 vector). Per 64-byte code
// vector (16 rows x 16 weights = 256 multiply-adds):
//   1 aligned load, 1 shift, 4 masks -> planes 0 and 2 as {0..3}, planes 1 and 3 as 4 x {0..3} (masks 0x03
//   and 0x0C of the codes and of codes >> 4: one shift instead of three), then per activation digit
//   4 vpdpbusd against the digit's plane dwords broadcast (shared by the T tiles walked in lockstep).
//   Planes 0+2 and 4 x (planes 1+3) go to two accumulators; the second is exactly divisible by 4 and
//   is shifted down once per group. -sum(q) starts the first, so a group ends at the exact integer
//   sum (code - 1) * q, combined over digits and scaled exactly as gemm16_half does (bit-identical).
// Measured in L2 on Zen 4, one core, K = 5120 (docs/cpu-kernels.md): q8 ~173, q16 ~107 GMAC/s against the
// canonical matvec's 87 / 68: q16 is now bound by its 8 vpdpbusd per 256 weights (1 per cycle).

// acc + the u8 x s8 4-products of each int32 lane (vpdpbusd; vpmaddubsw + vpmaddwd without VNNI, where the
// 16-bit pair sums stay below 2 * 12 * 127 for the x4 planes).
TGT_INLINE __m512i dp_u8s8(__m512i acc, __m512i u, __m512i s) {
#if BONSAI_AVX512_VNNI
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

constexpr int64_t kTilePrefetchL2 = 8192;  // the second (L2) prefetch distance of the q16/q24 tile streams

// One group of T tiles in lockstep: codes[t] = tile t's first code vector of the group (8 vectors, 64 B
// apart), dv[t] = its 16 fp16 d; qg = digit 0 of the activation at this group's first plane dword
// (digit l at + l * K, plane p at + p * P); qsum_g = -sum digit 0 of the group (digit l at + l * G);
// s = the group's activation scale times the digit unit. facc[t] (16 rows) += the scaled group dot.
template <int T, int L, int P>
TGT_INLINE void tiles_x1_group(const uint8_t* const* codes, const uint8_t* const* dv, const int8_t* qg, int64_t K,
                               const int32_t* qsum_g, int64_t G, float s, __m512* facc) {
  const __m512i m3 = _mm512_set1_epi8(3), mC = _mm512_set1_epi8(12);
  __m512i a1[T][L], a4[T][L];  // planes 0 + 2 (from -sum q); 4 x planes 1 + 3
  for (int t = 0; t < T; ++t)
    for (int l = 0; l < L; ++l) {
      a1[t][l] = _mm512_set1_epi32(-qsum_g[l * G]);
      a4[t][l] = _mm512_setzero_si512();
    }
  for (int j = 0; j < 8; ++j) {
    __m512i x[L][4];
    for (int l = 0; l < L; ++l)
      for (int p = 0; p < 4; ++p) x[l][p] = bcast32(qg + l * K + p * P + 4 * j);
    for (int t = 0; t < T; ++t) {
      // A software prefetch 2 KB ahead in each tile stream: on this host's fast-memory phase (~60 GB/s probe)
      // q8 went from 41-46 to 44-50 GB/s at K5120_N17408, 2 threads; q16 (compute-bound, ~43) and the
      // slow phase (~35) unchanged (docs/cpu-kernels.md).
      _mm_prefetch(reinterpret_cast<const char*>(codes[t] + 64 * j + kStreamPrefetch), _MM_HINT_T0);
      // At q16/q24 (compute-bound from DRAM in the fast phase) also one 8 KB ahead into L2 (T1): q16 +2.7% in
      // the fast phase (median of 248 interleaved rounds, 46.1 -> 47.4 GB/s), -0.4% (noise) in the ~34 GB/s
      // phase, same in L2 (docs/cpu-kernels.md, "Decode from DRAM at q16 (round 3)"). 3 KB into L1 + 6 KB
      // into L2 gained 6% fast but lost 3% slow. q8 (not compute-bound) was not measured with it: left as is.
      if constexpr (L >= 2) _mm_prefetch(reinterpret_cast<const char*>(codes[t] + 64 * j + kTilePrefetchL2), _MM_HINT_T1);
      const __m512i a = _mm512_load_si512(codes[t] + 64 * j);
      const __m512i b = _mm512_srli_epi16(a, 4);  // 16-bit shift: the masks drop the bits from the next byte
      const __m512i p0 = _mm512_and_si512(a, m3), p1 = _mm512_and_si512(a, mC);
      const __m512i p2 = _mm512_and_si512(b, m3), p3 = _mm512_and_si512(b, mC);
      for (int l = 0; l < L; ++l) {
        a1[t][l] = dp_u8s8(a1[t][l], p0, x[l][0]);
        a4[t][l] = dp_u8s8(a4[t][l], p1, x[l][1]);
        a1[t][l] = dp_u8s8(a1[t][l], p2, x[l][2]);
        a4[t][l] = dp_u8s8(a4[t][l], p3, x[l][3]);
      }
    }
  }
  const __m512 sv = _mm512_set1_ps(s);
  for (int t = 0; t < T; ++t) {
    __m512i tot = _mm512_add_epi32(a1[t][0], _mm512_srai_epi32(a4[t][0], 2));
    for (int l = 1; l < L; ++l) tot = times254_add(tot, _mm512_add_epi32(a1[t][l], _mm512_srai_epi32(a4[t][l], 2)));
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(dv[t])));
    facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_mul_ps(d, sv), facc[t]);
  }
}

// T whole tiles (tile[t] = its first byte) against one quantised activation row: facc[t] = 16 rows' outputs.
template <int T, int L>
TGT_INLINE void tiles_x1_run(const uint8_t* const* tile, int64_t K, const int8_t* q, const float* qs,
                             const int32_t* qsum, __m512* facc) {
  const int64_t G = K / 128, C = G / 2;
  for (int t = 0; t < T; ++t) facc[t] = _mm512_setzero_ps();
  const uint8_t* codes[T];
  const uint8_t* dv[T];
  for (int64_t c = 0; c < C; ++c)
    for (int h = 0; h < 2; ++h) {
      const int64_t g = 2 * c + h;
      for (int t = 0; t < T; ++t) {
        codes[t] = tile[t] + c * kTileChunkBytes + 512 * h;
        dv[t] = tile[t] + c * kTileChunkBytes + 1024 + 32 * h;
      }
      tiles_x1_group<T, L, 64>(codes, dv, q + 256 * c + 32 * h, K, qsum + g, G, qs[g] * digit_unit(L), facc);
    }
  if (G & 1) {  // the tail chunk: one group, activation planes 32 apart
    for (int t = 0; t < T; ++t) {
      codes[t] = tile[t] + C * kTileChunkBytes;
      dv[t] = codes[t] + 512;
    }
    tiles_x1_group<T, L, 32>(codes, dv, q + 256 * C, K, qsum + 2 * C, G, qs[2 * C] * digit_unit(L), facc);
  }
}

// Tile t's 16 outputs into y[16t ..], clipped at N.
TGT_INLINE void store_tile_rows(float* y, int64_t N, int64_t t, __m512 v) {
  const int64_t n = t * kTileRows, left = N - n;
  if (left >= kTileRows) _mm512_storeu_ps(y + n, v);
  else _mm512_mask_storeu_ps(y + n, __mmask16((1u << left) - 1), v);
}

template <int L>
TGT void q8_tiles_x1_levels(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                            const float* qs, const int32_t* qsum, float* y) {
  const int64_t tb = tile_bytes(K);
  // Two equal runs of tiles in lockstep (two long sequential streams; each activation broadcast serves two
  // tiles: 2 measured best, 4 spills), then the odd tile. A tile's arithmetic does not depend on its run.
  const int64_t Q = (t1 - t0) / 2;
  for (int64_t j = 0; j < Q; ++j) {
    const int64_t ta = t0 + j, tb2 = t0 + Q + j;
    const uint8_t* tile[2] = {tiles + ta * tb, tiles + tb2 * tb};
    __m512 facc[2];
    tiles_x1_run<2, L>(tile, K, q, qs, qsum, facc);
    store_tile_rows(y, N, ta, facc[0]);
    store_tile_rows(y, N, tb2, facc[1]);
  }
  if (t0 + 2 * Q < t1) {
    const int64_t t = t1 - 1;
    const uint8_t* tile[1] = {tiles + t * tb};
    __m512 facc[1];
    tiles_x1_run<1, L>(tile, K, q, qs, qsum, facc);
    store_tile_rows(y, N, t, facc[0]);
  }
}

TGT void ternary_tiles_q8_x1_avx512(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                                    const float* qscale, const int32_t* qsum, int levels, float* y) {
  if (levels == 1) q8_tiles_x1_levels<1>(tiles, K, N, t0, t1, q, qscale, qsum, y);
  else if (levels == 2) q8_tiles_x1_levels<2>(tiles, K, N, t0, t1, q, qscale, qsum, y);
  else q8_tiles_x1_levels<3>(tiles, K, N, t0, t1, q, qscale, qsum, y);
}

// GEMM (M > 1) on one tile: the canonical GEMM's per-chunk work (gemm16_chunk) with the codes loaded as
// stored instead of gathered and transposed, and the d vectors loaded instead of gathered.
template <int L>
TGT void q8_tile16_xm(const uint8_t* tile, int64_t K, const int8_t* q, const float* qs, const int32_t* qsum,
                      int64_t M, float* y, int64_t ldy, int nr) {
  const int64_t G = K / 128, C = G / 2;
  constexpr int kMT = 64;
  alignas(64) __m512i pl[16][4];  // decoded planes of one chunk of 16 rows: [dword k][plane t], lane = row
  alignas(64) __m512 facc[kMT];   // [m] 16 rows
  const __mmask16 rows = __mmask16((1u << nr) - 1);
  for (int64_t m0 = 0; m0 < M; m0 += kMT) {
    const int64_t mc = std::min<int64_t>(kMT, M - m0);
    for (int64_t m = 0; m < mc; ++m) facc[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* ch = tile + c * kTileChunkBytes;
      decode_planes(reinterpret_cast<const __m512i*>(ch), 16, pl);
      const __m512 dA = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ch + 1024)));
      const __m512 dB = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ch + 1056)));
      gemm16_chunk<L, 64>(pl, 2, dA, dB, q, K, G, c, qs, qsum, m0, mc, facc);
    }
    if (G & 1) {
      const uint8_t* ch = tile + C * kTileChunkBytes;
      decode_planes(reinterpret_cast<const __m512i*>(ch), 8, pl);
      const __m512 dA = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(ch + 512)));
      gemm16_chunk<L, 32>(pl, 1, dA, dA, q, K, G, C, qs, qsum, m0, mc, facc);
    }
    for (int64_t m = 0; m < mc; ++m) _mm512_mask_storeu_ps(y + (m0 + m) * ldy, rows, facc[m]);
  }
}

TGT void ternary_tiles_q8_xm_avx512(const uint8_t* tiles, int64_t K, int64_t N, int64_t t0, int64_t t1, const int8_t* q,
                                    const float* qscale, const int32_t* qsum, int levels, int64_t M, float* y,
                                    int64_t ldy) {
  const int64_t tb = tile_bytes(K);
  for (int64_t t = t0; t < t1; ++t) {
    const int nr = int(std::min<int64_t>(kTileRows, N - t * kTileRows));
    const uint8_t* tile = tiles + t * tb;
    float* yt = y + t * kTileRows;
    if (levels == 1) q8_tile16_xm<1>(tile, K, q, qscale, qsum, M, yt, ldy, nr);
    else if (levels == 2) q8_tile16_xm<2>(tile, K, q, qscale, qsum, M, yt, ldy, nr);
    else q8_tile16_xm<3>(tile, K, q, qscale, qsum, M, yt, ldy, nr);
  }
}
