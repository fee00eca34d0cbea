#include <gtest/gtest.h>

#include <cmath>

#include "util/half.h"

using namespace bonsai;

TEST(Half, Fp16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / nan
    EXPECT_EQ(f32_to_fp16(fp16_to_f32(uint16_t(h))), h) << h;
  }
}

TEST(Half, Fp16KnownValues) {
  EXPECT_EQ(f32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7c00);
  EXPECT_EQ(f32_to_fp16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  // Ties round to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(f32_to_fp16(1.0f + 0.00048828125f), 0x3c00);
  EXPECT_EQ(f32_to_fp16(1.0f + 3 * 0.00048828125f), 0x3c02);
  EXPECT_FLOAT_EQ(fp16_to_f32(0x3555), 0.333251953125f);
}

TEST(Half, Fp16RoundingMatchesNearest) {
  // Every float on a grid rounds to the nearest fp16 (ties to even), checked against a brute search.
  for (float x = -70000.f; x < 70000.f; x += 13.37f) {
    uint16_t h = f32_to_fp16(x);
    float back = fp16_to_f32(h);
    if (std::fabs(x) > 65504.f) continue;
    float up = fp16_to_f32(uint16_t(h + 1)), dn = fp16_to_f32(uint16_t(h - 1));
    EXPECT_LE(std::fabs(back - x), std::fabs(up - x) + 1e-9) << x;
    EXPECT_LE(std::fabs(back - x), std::fabs(dn - x) + 1e-9) << x;
  }
}

TEST(Half, Bf16) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);   // tie -> even
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);   // tie -> even (up)
  for (uint32_t b = 0; b < 0x10000; b += 7) {
    if ((b & 0x7f80) == 0x7f80) continue;
    EXPECT_EQ(f32_to_bf16(bf16_to_f32(uint16_t(b))), b);
  }
}
