// Ternary codec tests: PQ2_0 / PTQ1_0 / MLX round trips, the PTQ1_0 trit alphabet, a hand-computed block
// that pins the element order, code-3 handling and the converter-exact quantiser.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "format/ternary_codec.h"
#include "util/error.h"
#include "util/half.h"

using namespace bonsai;

namespace {

struct Mat {
  uint64_t N, K;
  std::vector<uint32_t> words;   // [N, K/16]
  std::vector<uint16_t> scales;  // [N, K/128]
};

Mat random_ternary(uint64_t N, uint64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  Mat m{N, K, std::vector<uint32_t>(N * K / 16, 0), std::vector<uint16_t>(N * K / 128)};
  std::uniform_int_distribution<int> code(0, 2);
  for (uint64_t r = 0; r < N; ++r)
    for (uint64_t e = 0; e < K; ++e) m.words[r * K / 16 + e / 16] |= uint32_t(code(rng)) << (2 * (e % 16));
  std::uniform_real_distribution<float> sc(0.004f, 0.03f);
  for (auto& s : m.scales) s = f32_to_fp16(sc(rng));
  return m;
}

void set_code(uint32_t* words, int e, int q) {
  words[e / 16] = (words[e / 16] & ~(3u << (2 * (e % 16)))) | (uint32_t(q) << (2 * (e % 16)));
}

// Block of all-zero weights (code 1 everywhere).
std::vector<uint32_t> zero_words() { return std::vector<uint32_t>(8, 0x55555555u); }

}  // namespace

TEST(TernaryCodec, RandomRowsRoundTripByteExact) {
  for (uint64_t K : {128u, 384u, 1024u}) {
    const uint64_t N = 7;
    Mat m = random_ternary(N, K, 1234 + uint32_t(K));
    const uint64_t groups = N * K / 128;

    std::vector<uint8_t> pq2(groups * kPq2Bytes, 0xEE);
    canonical_to_pq2(m.words.data(), m.scales.data(), N, K, pq2.data());
    std::vector<uint32_t> w1(m.words.size(), 0xDEADBEEF);
    std::vector<uint16_t> s1(m.scales.size(), 0xBEEF);
    pq2_to_canonical(pq2.data(), N, K, w1.data(), s1.data());
    EXPECT_EQ(w1, m.words);
    EXPECT_EQ(s1, m.scales);

    std::vector<uint8_t> ptq1(groups * kPtq1Bytes, 0xEE);
    pq2_to_ptq1(pq2.data(), N, K, ptq1.data(), "rand");
    std::vector<uint8_t> pq2b(groups * kPq2Bytes, 0x11);
    ptq1_to_pq2(ptq1.data(), N, K, pq2b.data());
    EXPECT_EQ(pq2b, pq2);  // PQ2_0 -> PTQ1_0 -> PQ2_0 byte-exact
    std::vector<uint32_t> w2(m.words.size(), 0xDEADBEEF);
    std::vector<uint16_t> s2(m.scales.size(), 0xBEEF);
    pq2_to_canonical(pq2b.data(), N, K, w2.data(), s2.data());
    EXPECT_EQ(w2, m.words);
    EXPECT_EQ(s2, m.scales);

    // And the other way: PTQ1_0 -> PQ2_0 -> PTQ1_0.
    std::vector<uint8_t> ptq1b(groups * kPtq1Bytes, 0x22);
    pq2_to_ptq1(pq2b.data(), N, K, ptq1b.data(), "rand");
    EXPECT_EQ(ptq1b, ptq1);

    // Block accessors read the split form's codes and scales.
    for (uint64_t g = 0; g < groups; g += 3) {
      const uint8_t* blk = pq2.data() + g * kPq2Bytes;
      EXPECT_EQ(pq2_block_scale(blk), m.scales[g]);
      for (int e = 0; e < 128; e += 7) EXPECT_EQ(pq2_block_code(blk, e), ternary_code(&m.words[g * 8], uint64_t(e)));
    }

    // MLX: words as-is, biases = -scales, both ways.
    std::vector<uint16_t> biases(m.scales.size());
    mlx_make_biases(m.scales.data(), m.scales.size(), biases.data());
    for (size_t i = 0; i < biases.size(); ++i) EXPECT_EQ(fp16_to_f32(biases[i]), -fp16_to_f32(m.scales[i]));
    EXPECT_NO_THROW(mlx_check_biases(m.scales.data(), biases.data(), N, K, "mlx"));
  }
}

TEST(TernaryCodec, MlxBiasMismatchNamesTensorRowGroup) {
  Mat m = random_ternary(3, 256, 7);
  std::vector<uint16_t> biases(m.scales.size());
  mlx_make_biases(m.scales.data(), m.scales.size(), biases.data());
  biases[2 * 2 + 1] = m.scales[2 * 2 + 1];  // row 2, group 1: +scale instead of -scale
  try {
    mlx_check_biases(m.scales.data(), biases.data(), 3, 256, "language_model.lm_head");
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("language_model.lm_head: row 2 group 1"), std::string::npos) << e.what();
  }
}

// Trits of v in [0, 243), most significant first.
static void trits5(int v, int* t) {
  for (int n = 4; n >= 0; --n) {
    t[n] = v % 3;
    v /= 3;
  }
}

TEST(TernaryCodec, Ptq1AllFiveTritBytes) {
  // For each of the 243 trit patterns, place it in byte 0 (elements 0,16,32,48,64) and byte 19
  // (elements 83,91,99,107,115), check the byte value against ceil(256 v / 243) and decode back.
  std::vector<int> seen(256, 0);
  for (int v = 0; v < 243; ++v) {
    int t[5];
    trits5(v, t);
    auto w = zero_words();
    for (int n = 0; n < 5; ++n) {
      set_code(w.data(), 16 * n, t[n]);
      set_code(w.data(), 80 + 3 + 8 * n, t[n]);
    }
    uint8_t blk[kPtq1Bytes];
    ASSERT_TRUE(ptq1_encode_block(w.data(), 0x3c00, blk));
    const int expect = (v * 256 + 242) / 243;
    EXPECT_EQ(blk[0], expect) << v;
    EXPECT_EQ(blk[19], expect) << v;
    seen[blk[0]]++;
    uint32_t back[8];
    uint16_t d;
    ptq1_decode_block(blk, back, &d);
    EXPECT_EQ(std::vector<uint32_t>(back, back + 8), w) << v;
    EXPECT_EQ(d, 0x3c00);
    // Decode the byte alone with the header's digit formula.
    for (int n = 0; n < 5; ++n) {
      const uint8_t p3[5] = {1, 3, 9, 27, 81};
      EXPECT_EQ((uint8_t(blk[0] * p3[n]) * 3) >> 8, t[n]) << v << " trit " << n;
    }
  }
  int distinct = 0;
  for (int c : seen) distinct += c == 1;
  EXPECT_EQ(distinct, 243);  // an injective alphabet
}

TEST(TernaryCodec, Ptq1AllFourTritQhBytes) {
  for (int v = 0; v < 81; ++v) {
    int t[4] = {v / 27, (v / 9) % 3, (v / 3) % 3, v % 3};
    for (int h = 0; h < 2; ++h) {
      auto w = zero_words();
      for (int n = 0; n < 4; ++n) set_code(w.data(), 120 + h + 2 * n, t[n]);
      uint8_t blk[kPtq1Bytes];
      ASSERT_TRUE(ptq1_encode_block(w.data(), 0x1234, blk));
      EXPECT_EQ(blk[24 + h], (3 * v * 256 + 242) / 243) << v;
      EXPECT_EQ(blk[24 + (1 - h)], (3 * 40 * 256 + 242) / 243) << v;  // the other qh byte: all code 1
      uint32_t back[8];
      uint16_t d;
      ptq1_decode_block(blk, back, &d);
      EXPECT_EQ(std::vector<uint32_t>(back, back + 8), w) << v;
      EXPECT_EQ(d, 0x1234);
    }
  }
}

// A block written out by hand from the layout in FACTS section 4 (not from the encoder).
// All weights zero (code 1) except:
//   e0 = +d   (PTQ1 byte 0 trit 0;  PQ2 word 0 bits 0-1)
//   e17 = -d  (PTQ1 byte 1 trit 1;  PQ2 word 1 bits 2-3)
//   e79 = +d  (PTQ1 byte 15 trit 4; PQ2 word 4 bits 30-31)
//   e80 = -d  (PTQ1 byte 16 trit 0; PQ2 word 5 bits 0-1)
//   e119 = +d (PTQ1 byte 23 trit 4 since 119 = 80 + 7 + 8*4; PQ2 word 7 bits 14-15)
//   e121 = -d (PTQ1 qh[1] trit 0;   PQ2 word 7 bits 18-19)
//   e126 = +d (PTQ1 qh[0] trit 3;   PQ2 word 7 bits 28-29)
// d = 0.0625 = fp16 0x2C00.
// PTQ1 bytes, v = sum trit_n 3^(4-n), byte = ceil(256 v / 243):
//   byte 0: (2,1,1,1,1) v=202 -> 213 = 0xD5; byte 1: (1,0,1,1,1) v=94 -> 100 = 0x64;
//   bytes of all code 1: v=121 -> 128 = 0x80; byte 15 and 23: (1,1,1,1,2) v=122 -> 129 = 0x81;
//   byte 16: (0,1,1,1,1) v=40 -> 43 = 0x2B;
//   qh[0]: (1,1,1,2) v=3*41=123 -> 130 = 0x82; qh[1]: (0,1,1,1) v=3*13=39 -> 42 = 0x2A.
// PQ2 words (0x55555555 = all code 1): w0 0x55555556, w1 0x55555551, w4 0x95555555, w5 0x55555554,
//   w7 0x65519555 (nibbles: bits 12-15 0101->1001, bits 16-19 0101->0001, bits 28-31 0101->0110).
TEST(TernaryCodec, HandComputedBlockPinsElementOrder) {
  const uint8_t ptq1[kPtq1Bytes] = {0xD5, 0x64, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
                                    0x80, 0x80, 0x80, 0x80, 0x80, 0x81, 0x2B, 0x80, 0x80, 0x80,
                                    0x80, 0x80, 0x80, 0x81, 0x82, 0x2A, 0x00, 0x2C};
  const uint32_t words[8] = {0x55555556u, 0x55555551u, 0x55555555u, 0x55555555u,
                             0x95555555u, 0x55555554u, 0x55555555u, 0x65519555u};
  const uint8_t pq2[kPq2Bytes] = {0x00, 0x2C,                                             //
                                  0x56, 0x55, 0x55, 0x55, 0x51, 0x55, 0x55, 0x55,         // w0 w1
                                  0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55,         // w2 w3
                                  0x55, 0x55, 0x55, 0x95, 0x54, 0x55, 0x55, 0x55,         // w4 w5
                                  0x55, 0x55, 0x55, 0x55, 0x55, 0x95, 0x51, 0x65};        // w6 w7
  uint32_t w[8];
  uint16_t d;
  ptq1_decode_block(ptq1, w, &d);
  EXPECT_EQ(std::vector<uint32_t>(w, w + 8), std::vector<uint32_t>(words, words + 8));
  EXPECT_EQ(d, 0x2C00);
  uint8_t enc[kPtq1Bytes];
  ASSERT_TRUE(ptq1_encode_block(words, 0x2C00, enc));
  EXPECT_EQ(std::memcmp(enc, ptq1, kPtq1Bytes), 0);

  pq2_decode_block(pq2, w, &d);
  EXPECT_EQ(std::vector<uint32_t>(w, w + 8), std::vector<uint32_t>(words, words + 8));
  EXPECT_EQ(d, 0x2C00);
  uint8_t enc2[kPq2Bytes];
  pq2_encode_block(words, 0x2C00, enc2);
  EXPECT_EQ(std::memcmp(enc2, pq2, kPq2Bytes), 0);

  // Values through ternary_code.
  const int plus[] = {0, 79, 119, 126}, minus[] = {17, 80, 121};
  int n_nonzero = 0;
  for (int e = 0; e < 128; ++e) n_nonzero += ternary_code(words, e) != 1;
  EXPECT_EQ(n_nonzero, 7);
  for (int e : plus) EXPECT_EQ(ternary_code(words, e), 2) << e;
  for (int e : minus) EXPECT_EQ(ternary_code(words, e), 0) << e;
}

TEST(TernaryCodec, Code3DecodesAsPlusTwoButPtq1Refuses) {
  auto w = zero_words();
  set_code(w.data(), 42, 3);
  uint8_t blk[kPq2Bytes];
  pq2_encode_block(w.data(), f32_to_fp16(0.5f), blk);
  uint32_t back[8];
  uint16_t d;
  pq2_decode_block(blk, back, &d);
  EXPECT_EQ(ternary_code(back, 42), 3);
  EXPECT_EQ((ternary_code(back, 42) - 1) * fp16_to_f32(d), 1.0f);  // +2d
  uint8_t p1[kPtq1Bytes];
  EXPECT_FALSE(ptq1_encode_block(w.data(), d, p1));

  Mat m = random_ternary(4, 256, 99);
  set_code(m.words.data() + 2 * (256 / 16), 128 + 5, 3);  // row 2, group 1
  std::vector<uint8_t> src(4 * 2 * kPq2Bytes), dst(4 * 2 * kPtq1Bytes);
  canonical_to_pq2(m.words.data(), m.scales.data(), 4, 256, src.data());
  try {
    pq2_to_ptq1(src.data(), 4, 256, dst.data(), "blk.0.ffn_up.weight");
    FAIL() << "expected a throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("blk.0.ffn_up.weight: row 2 group 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("code 3"), std::string::npos) << msg;
  }
}

TEST(TernaryCodec, RejectsKNotMultipleOf128) {
  std::vector<uint8_t> src(64);
  std::vector<uint32_t> w(16);
  std::vector<uint16_t> s(2);
  EXPECT_THROW(pq2_to_canonical(src.data(), 1, 200, w.data(), s.data()), Error);
  EXPECT_THROW(ptq1_to_pq2(src.data(), 1, 200, src.data()), Error);
}

TEST(TernaryCodec, QuantiserKnownValues) {
  float g[128] = {};
  g[0] = 0.5f;     // max |w|: d = 0.5, code 2
  g[1] = -0.5f;    // code 0
  g[2] = 0.25f;    // w/d = 0.5 exactly: rounds half away from zero -> code 2
  g[3] = -0.25f;   // -> code 0
  g[4] = 0.2499f;  // -> code 1
  g[5] = -0.1f;    // -> code 1
  g[127] = 0.3f;   // 0.6 -> code 2
  uint32_t w[8];
  EXPECT_EQ(ternary_quantize_group(g, w), 0x3800);  // fp16(0.5)
  const int want[] = {2, 0, 2, 0, 1, 1};
  for (int e = 0; e < 6; ++e) EXPECT_EQ(ternary_code(w, e), want[e]) << e;
  EXPECT_EQ(ternary_code(w, 127), 2);
  for (int e = 6; e < 127; ++e) EXPECT_EQ(ternary_code(w, e), 1) << e;

  // d is stored as fp16 (0.1 -> 0x2E66) but codes come from dividing by the fp32 max.
  float h[128] = {};
  h[7] = -0.1f;
  h[8] = 0.05f;  // 0.05f and 0.1f share a mantissa: w/d = 0.5 exactly -> half away from zero -> code 2
  EXPECT_EQ(ternary_quantize_group(h, w), 0x2E66);
  EXPECT_EQ(ternary_code(w, 7), 0);
  EXPECT_EQ(ternary_code(w, 8), 2);

  // All zero: d = 0, all code 1.
  float z[128] = {};
  EXPECT_EQ(ternary_quantize_group(z, w), 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(w[i], 0x55555555u);

  // An already-ternary group {-s, 0, +s} with s representable in fp16 is reproduced exactly.
  Mat m = random_ternary(1, 128, 5);
  const float s = fp16_to_f32(m.scales[0]);
  float t[128];
  for (int e = 0; e < 128; ++e) t[e] = float(ternary_code(m.words.data(), e) - 1) * s;
  EXPECT_EQ(ternary_quantize_group(t, w), m.scales[0]);
  EXPECT_EQ(std::vector<uint32_t>(w, w + 8), m.words);
}
