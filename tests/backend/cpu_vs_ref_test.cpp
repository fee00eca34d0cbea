// Every bonsai::cpu op against bonsai::ref on seeded random inputs with awkward sizes (row tails that
// are not multiples of the 4-row tile, M beyond the 32-row activation tile, T not a multiple of the
// chunk), outputs poisoned with NaN first. Tolerances are max |cpu - ref| / max |ref| per output:
//   hadamard 1e-6; ternary_matmul / multi at the active activation precision (ternary_tol below: 1e-5 for
//   f32 and q24, 5e-4 for the q16 default, 1.5e-2 for q8; cpu_kernels_test.cpp derives the digit bounds); dequant_row exact; dense_bf16 / dense_f32 1e-5; rmsnorm family 1e-6;
//   rope 1e-6; attention 1e-5; sigmoid_gate_mul / silu_mul 1e-6; argmax exact; gdn_conv 1e-6;
//   gdn_gates 1e-6; gdn_recurrent / gdn_chunked 1e-5 (outputs and state).
// The measured errors are printed ("max rel err ...") when the tests run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/thread_pool.h"
#include "backend/ref/ops.h"
#include "op_test_util.h"

using namespace bonsai;
using namespace bonsai::test;

// Same signatures in both namespaces.
#define SAME_SIGNATURE(op) static_assert(std::is_same_v<decltype(&ref::op), decltype(&cpu::op)>, #op)
SAME_SIGNATURE(hadamard_forward);
SAME_SIGNATURE(hadamard_inverse);
SAME_SIGNATURE(ternary_matmul);
SAME_SIGNATURE(ternary_matmul_multi);
SAME_SIGNATURE(ternary_dequant_row);
SAME_SIGNATURE(dense_matmul_bf16);
SAME_SIGNATURE(dense_matmul_f32);
SAME_SIGNATURE(rmsnorm);
SAME_SIGNATURE(add_rmsnorm);
SAME_SIGNATURE(l2norm_heads);
SAME_SIGNATURE(gated_rmsnorm);
SAME_SIGNATURE(rope_neox);
SAME_SIGNATURE(attention_decode);
SAME_SIGNATURE(attention_prefill);
SAME_SIGNATURE(sigmoid_gate_mul);
SAME_SIGNATURE(silu_mul);
SAME_SIGNATURE(argmax);
SAME_SIGNATURE(gdn_conv);
SAME_SIGNATURE(gdn_gates);
SAME_SIGNATURE(gdn_recurrent);
SAME_SIGNATURE(gdn_chunked);

namespace {

// ternary_matmul's bound at the activation precision it runs (backend/cpu/kernels.h; per-digit error bounds
// and measured values in cpu_kernels_test.cpp).
double ternary_tol() {
  switch (cpu::ternary_activation()) {
    case cpu::TernaryActivation::q16: return 5e-4;  // measured up to 2.2e-4 at N = 4, K = 128 (a 4-value max)
    case cpu::TernaryActivation::q8: return 1.5e-2;
    default: return 1e-5;
  }
}

// Runs the CPU ops with 3 threads (more than one chunk per op, odd on purpose) unless a test says otherwise.
class CpuVsRef : public ::testing::Test {
 protected:
  void SetUp() override { cpu::set_num_threads(3); }
};

}  // namespace

TEST_F(CpuVsRef, Hadamard) {
  for (int64_t block : {1, 2, 8, 32, 128, 512, 1024}) {
    const int64_t rows = 3, K = 2 * std::max<int64_t>(block, 1024);
    auto x = randn(size_t(rows * K), 100 + uint32_t(block));
    auto s = random_signs(size_t(K), 200);
    for (bool inverse : {false, true})
      for (const int8_t* signs : {static_cast<const int8_t*>(s.data()), static_cast<const int8_t*>(nullptr)}) {
        auto a = x, b = x;
        if (inverse) {
          ref::hadamard_inverse(a.data(), rows, K, signs, block);
          cpu::hadamard_inverse(b.data(), rows, K, signs, block);
        } else {
          ref::hadamard_forward(a.data(), rows, K, signs, block);
          cpu::hadamard_forward(b.data(), rows, K, signs, block);
        }
        SCOPED_TRACE(testing::Message() << "block " << block << " inverse " << inverse);
        EXPECT_CLOSE(b, a, 1e-6);
      }
  }
}

TEST_F(CpuVsRef, TernaryMatmul) {
  for (int64_t M : {1, 2, 5, 37}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 384}, {4, 128}, {133, 1152}}) {
      auto W = random_ternary(N, K, 300 + uint32_t(N), /*p3=*/0.002);  // code 3 (+2d) must decode the same
      auto x = randn(size_t(M * K), 301);
      auto yr = poisoned(size_t(M * N)), yc = poisoned(size_t(M * N));
      ref::ternary_matmul(W.blocks.data(), N, K, x.data(), M, yr.data());
      cpu::ternary_matmul(W.blocks.data(), N, K, x.data(), M, yc.data());
      SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K);
      EXPECT_CLOSE(yc, yr, ternary_tol());
    }
  }
}

TEST_F(CpuVsRef, TernaryMatmulMulti) {
  const int64_t K = 640;
  for (int64_t M : {1, 5}) {
    auto A = random_ternary(37, K, 310), B = random_ternary(11, K, 311), C = random_ternary(64, K, 312);
    auto x = randn(size_t(M * K), 313);
    std::vector<float> ra = poisoned(size_t(M * 37)), rb = poisoned(size_t(M * 11)), rc = poisoned(size_t(M * 64));
    std::vector<float> ca = ra, cb = rb, cc = rc;
    const TernaryOut ref_outs[3] = {{A.blocks.data(), 37, ra.data()},
                                    {B.blocks.data(), 11, rb.data()},
                                    {C.blocks.data(), 64, rc.data()}};
    const TernaryOut cpu_outs[3] = {{A.blocks.data(), 37, ca.data()},
                                    {B.blocks.data(), 11, cb.data()},
                                    {C.blocks.data(), 64, cc.data()}};
    ref::ternary_matmul_multi(ref_outs, 3, K, x.data(), M);
    cpu::ternary_matmul_multi(cpu_outs, 3, K, x.data(), M);
    SCOPED_TRACE(M);
    EXPECT_CLOSE(ca, ra, ternary_tol());
    EXPECT_CLOSE(cb, rb, ternary_tol());
    EXPECT_CLOSE(cc, rc, ternary_tol());
    // And the same as three separate calls, bit for bit.
    auto sb = poisoned(size_t(M * 11));
    cpu::ternary_matmul(B.blocks.data(), 11, K, x.data(), M, sb.data());
    EXPECT_EQ(sb, cb);
  }
}

// A row map (TernaryOut::runs, how a GGUF's tiled GDN rows are read in place) gives the same product as
// the rows physically permuted; run boundaries fall inside the pool's row chunks and the kernels' row tiles.
TEST_F(CpuVsRef, TernaryMatmulRowRuns) {
  const int64_t N = 300, K = 384;
  auto W = random_ternary(N, K, 330);
  const RowRun runs[3] = {{0, 200, 100}, {100, 0, 123}, {223, 123, 77}};
  const size_t rb = size_t(K / 128 * kPq2Bytes);
  std::vector<uint8_t> permuted(W.blocks.size());
  for (const RowRun& r : runs)
    std::memcpy(&permuted[size_t(r.row) * rb], &W.blocks[size_t(r.src) * rb], size_t(r.count) * rb);
  for (int64_t M : {1, 5}) {
    auto x = randn(size_t(M * K), 331);
    auto want = poisoned(size_t(M * N)), rr = poisoned(size_t(M * N)), cr = poisoned(size_t(M * N));
    ref::ternary_matmul(permuted.data(), N, K, x.data(), M, want.data());
    const TernaryOut ro{W.blocks.data(), N, rr.data(), runs, 3}, co{W.blocks.data(), N, cr.data(), runs, 3};
    ref::ternary_matmul_multi(&ro, 1, K, x.data(), M);
    cpu::ternary_matmul_multi(&co, 1, K, x.data(), M);
    SCOPED_TRACE(M);
    EXPECT_EQ(rr, want);
    EXPECT_CLOSE(cr, want, ternary_tol());
  }
}

TEST_F(CpuVsRef, TernaryDequantRowExact) {
  const int64_t N = 9, K = 384;
  auto W = random_ternary(N, K, 320, 0.01);
  for (int64_t row : {0, 4, 8}) {
    auto a = poisoned(size_t(K)), b = poisoned(size_t(K));
    ref::ternary_dequant_row(W.blocks.data(), K, row, a.data());
    cpu::ternary_dequant_row(W.blocks.data(), K, row, b.data());
    EXPECT_EQ(a, b);
  }
}

TEST_F(CpuVsRef, DenseBf16) {
  for (int64_t M : {1, 5, 70}) {
    const int64_t N = 37, K = 1100;
    auto wf = randn(size_t(N * K), 330);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(wf[i]);
    auto x = randn(size_t(M * K), 331);
    auto a = poisoned(size_t(M * N)), b = poisoned(size_t(M * N));
    ref::dense_matmul_bf16(w.data(), N, K, x.data(), M, a.data());
    cpu::dense_matmul_bf16(w.data(), N, K, x.data(), M, b.data());
    SCOPED_TRACE(M);
    EXPECT_CLOSE(b, a, 1e-5);
  }
}

TEST_F(CpuVsRef, DenseF32) {
  // The canonical GDN a/b projections: fp32 [Nv, E]. N, K and M with tails on purpose.
  for (int64_t M : {1, 5, 70}) {
    for (auto [N, K] : {std::pair<int64_t, int64_t>{24, 1024}, {37, 1100}, {3, 7}}) {
      auto w = randn(size_t(N * K), 335 + uint32_t(K));
      auto x = randn(size_t(M * K), 336);
      auto a = poisoned(size_t(M * N)), b = poisoned(size_t(M * N));
      ref::dense_matmul_f32(w.data(), N, K, x.data(), M, a.data());
      cpu::dense_matmul_f32(w.data(), N, K, x.data(), M, b.data());
      SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K);
      EXPECT_CLOSE(b, a, 1e-5);
    }
  }
}

TEST_F(CpuVsRef, Norms) {
  const int64_t rows = 13, n = 333;
  auto x = randn(size_t(rows * n), 340, 3.0f), gain = randn(size_t(n), 341), z = randn(size_t(rows * n), 342);
  for (const float* g : {static_cast<const float*>(gain.data()), static_cast<const float*>(nullptr)}) {
    auto a = poisoned(x.size()), b = poisoned(x.size());
    ref::rmsnorm(x.data(), rows, n, g, 1e-6f, a.data());
    cpu::rmsnorm(x.data(), rows, n, g, 1e-6f, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
  }
  {  // big enough to be threaded: 40 rows of 5120
    auto xb = randn(size_t(40 * 5120), 343), gb = randn(5120, 344);
    auto a = poisoned(xb.size()), b = poisoned(xb.size());
    ref::rmsnorm(xb.data(), 40, 5120, gb.data(), 1e-6f, a.data());
    cpu::rmsnorm(xb.data(), 40, 5120, gb.data(), 1e-6f, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
  }
  {
    auto delta = randn(x.size(), 345);
    auto ha = x, hb = x;
    auto a = poisoned(x.size()), b = poisoned(x.size());
    ref::add_rmsnorm(ha.data(), delta.data(), rows, n, gain.data(), 1e-6f, a.data());
    cpu::add_rmsnorm(hb.data(), delta.data(), rows, n, gain.data(), 1e-6f, b.data());
    EXPECT_EQ(ha, hb);  // the residual add is one fp32 add in both
    EXPECT_CLOSE(b, a, 1e-6);
  }
  for (int64_t hd : {128, 37}) {
    auto a = randn(size_t(rows * hd), 346), b = a;
    ref::l2norm_heads(a.data(), rows, hd);
    cpu::l2norm_heads(b.data(), rows, hd);
    EXPECT_CLOSE(b, a, 1e-6);
  }
  {
    const int64_t Dv = 128, r = 13;
    auto o = randn(size_t(r * Dv), 347), zz = randn(size_t(r * Dv), 348, 3.0f), gg = randn(size_t(Dv), 349);
    auto a = poisoned(o.size()), b = poisoned(o.size());
    ref::gated_rmsnorm(o.data(), zz.data(), gg.data(), r, Dv, 1e-6f, a.data());
    cpu::gated_rmsnorm(o.data(), zz.data(), gg.data(), r, Dv, 1e-6f, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
  }
  (void)z;
  {  // out may alias x (documented): in place gives the same bits as out of place
    auto a = poisoned(x.size());
    cpu::rmsnorm(x.data(), rows, n, gain.data(), 1e-6f, a.data());
    auto inplace = x;
    cpu::rmsnorm(inplace.data(), rows, n, gain.data(), 1e-6f, inplace.data());
    EXPECT_EQ(inplace, a);
    auto r_inplace = x, r_out = poisoned(x.size());
    ref::rmsnorm(x.data(), rows, n, gain.data(), 1e-6f, r_out.data());
    ref::rmsnorm(r_inplace.data(), rows, n, gain.data(), 1e-6f, r_inplace.data());
    EXPECT_EQ(r_inplace, r_out);
  }
}

TEST_F(CpuVsRef, Rope) {
  for (int64_t pos : {0, 1, 7, 4097, 262143})
    for (auto [hd, rot] : {std::pair<int64_t, int64_t>{256, 64}, {64, 64}, {40, 18}}) {
      auto a = randn(size_t(5 * hd), 350 + uint32_t(pos)), b = a;
      ref::rope_neox(a.data(), 5, hd, rot, pos, 1e7f);
      cpu::rope_neox(b.data(), 5, hd, rot, pos, 1e7f);
      SCOPED_TRACE(testing::Message() << "pos " << pos << " hd " << hd << " rot " << rot);
      EXPECT_CLOSE(b, a, 1e-6);
    }
}

TEST_F(CpuVsRef, Attention) {
  for (auto [T, Hq, Hkv, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{13, 6, 2, 40}, {1, 4, 4, 64},
                               {300, 24, 4, 256}, {5, 3, 1, 33}}) {
    const float scale = 1.0f / std::sqrt(float(D));
    auto q = randn(size_t(Hq * D), 360, 2.0f), k = randn(size_t(T * Hkv * D), 361), v = randn(size_t(T * Hkv * D), 362);
    auto a = poisoned(size_t(Hq * D)), b = poisoned(size_t(Hq * D));
    ref::attention_decode(q.data(), k.data(), v.data(), T, Hq, Hkv, D, scale, a.data());
    cpu::attention_decode(q.data(), k.data(), v.data(), T, Hq, Hkv, D, scale, b.data());
    SCOPED_TRACE(testing::Message() << "decode T " << T << " Hq " << Hq << " Hkv " << Hkv << " D " << D);
    EXPECT_CLOSE(b, a, 1e-5);
  }
  for (auto [M, p0] : {std::pair<int64_t, int64_t>{5, 8}, {7, 0}, {1, 12}}) {
    const int64_t Hq = 6, Hkv = 3, D = 64, T = p0 + M;
    auto q = randn(size_t(M * Hq * D), 363, 2.0f), k = randn(size_t(T * Hkv * D), 364), v = randn(size_t(T * Hkv * D), 365);
    auto a = poisoned(size_t(M * Hq * D)), b = poisoned(size_t(M * Hq * D));
    ref::attention_prefill(q.data(), k.data(), v.data(), M, p0, Hq, Hkv, D, 0.125f, a.data());
    cpu::attention_prefill(q.data(), k.data(), v.data(), M, p0, Hq, Hkv, D, 0.125f, b.data());
    SCOPED_TRACE(testing::Message() << "prefill M " << M << " p0 " << p0);
    EXPECT_CLOSE(b, a, 1e-5);
  }
}

TEST_F(CpuVsRef, Elementwise) {
  for (int64_t n : {1001, 70001}) {
    auto x = randn(size_t(n), 370), gate = randn(size_t(n), 371, 4.0f), up = randn(size_t(n), 372);
    auto a = x, b = x;
    ref::sigmoid_gate_mul(a.data(), gate.data(), n);
    cpu::sigmoid_gate_mul(b.data(), gate.data(), n);
    EXPECT_CLOSE(b, a, 1e-6);
    auto c = poisoned(size_t(n)), d = poisoned(size_t(n));
    ref::silu_mul(gate.data(), up.data(), n, c.data());
    cpu::silu_mul(gate.data(), up.data(), n, d.data());
    EXPECT_CLOSE(d, c, 1e-6);
  }
}

TEST_F(CpuVsRef, Argmax) {
  const int64_t n = 248320;
  auto x = randn(size_t(n), 380);
  x[200000] = 9.0f;
  x[150001] = 9.0f;  // tie in a later slice than index 1, earlier than 200000: lowest index wins
  x[3] = NAN;
  EXPECT_EQ(ref::argmax(x.data(), n), 150001);
  EXPECT_EQ(cpu::argmax(x.data(), n), 150001);
  x[70000] = 9.0f;  // a different slice, lower index
  EXPECT_EQ(cpu::argmax(x.data(), n), 70000);
  EXPECT_EQ(ref::argmax(x.data(), n), 70000);
  for (int64_t m : {1, 2, 17}) {
    auto y = randn(size_t(m), 381 + uint32_t(m));
    EXPECT_EQ(cpu::argmax(y.data(), m), ref::argmax(y.data(), m));
  }
  const float nans[3] = {NAN, NAN, NAN};
  EXPECT_EQ(cpu::argmax(nans, 3), 0);
}

TEST_F(CpuVsRef, GdnConv) {
  for (int64_t T : {13, 1, 2}) {
    const int64_t C = 37, Kc = 4;
    auto x = randn(size_t(T * C), 390), taps = randn(size_t(C * Kc), 391, 0.5f), st = randn(size_t((Kc - 1) * C), 392);
    auto sa = st, sb = st;
    auto a = poisoned(size_t(T * C)), b = poisoned(size_t(T * C));
    ref::gdn_conv(x.data(), sa.data(), taps.data(), T, C, Kc, a.data());
    cpu::gdn_conv(x.data(), sb.data(), taps.data(), T, C, Kc, b.data());
    SCOPED_TRACE(T);
    EXPECT_CLOSE(b, a, 1e-6);
    EXPECT_EQ(sa, sb);  // state is a copy of inputs: exact
  }
  {  // many channels: threaded
    const int64_t T = 3, C = 10240, Kc = 4;
    auto x = randn(size_t(T * C), 393), taps = randn(size_t(C * Kc), 394, 0.5f), st = randn(size_t((Kc - 1) * C), 395);
    auto sa = st, sb = st;
    auto a = poisoned(size_t(T * C)), b = poisoned(size_t(T * C));
    ref::gdn_conv(x.data(), sa.data(), taps.data(), T, C, Kc, a.data());
    cpu::gdn_conv(x.data(), sb.data(), taps.data(), T, C, Kc, b.data());
    EXPECT_CLOSE(b, a, 1e-6);
    EXPECT_EQ(sa, sb);
  }
}

TEST_F(CpuVsRef, GdnGates) {
  const int64_t T = 13, Nv = 6;
  auto a = randn(size_t(T * Nv), 400, 8.0f), b = randn(size_t(T * Nv), 401, 3.0f);
  a[0] = 25.0f;  // above the softplus threshold
  a[1] = -30.0f;
  auto A = uniform(size_t(Nv), 402, -2.0f, 1.0f), dt = randn(size_t(Nv), 403);
  for (auto& x : A) x = -std::exp(x);  // A = -exp(A_log), what GdnWeights::A holds
  auto ga = poisoned(size_t(T * Nv)), gb = ga, ba = ga, bb = ga;
  ref::gdn_gates(a.data(), b.data(), A.data(), dt.data(), T, Nv, ga.data(), ba.data());
  cpu::gdn_gates(a.data(), b.data(), A.data(), dt.data(), T, Nv, gb.data(), bb.data());
  EXPECT_CLOSE(gb, ga, 1e-6);
  EXPECT_CLOSE(bb, ba, 1e-6);
}

TEST_F(CpuVsRef, GdnRecurrentAndChunked) {
  for (auto [T, Nk, Nv, Dk, Dv] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{13, 2, 6, 32, 24},
                                   {1, 1, 3, 128, 128}, {150, 1, 3, 128, 128}}) {
    auto c = make_gdn_case(T, Nk, Nv, Dk, Dv, 410);
    SCOPED_TRACE(testing::Message() << "T " << T << " Nk " << Nk << " Nv " << Nv << " Dk " << Dk << " Dv " << Dv);
    auto sr = c.state, sc = c.state;
    auto o_ref = poisoned(size_t(T * Nv * Dv)), o_cpu = o_ref;
    ref::gdn_recurrent(sr.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), T, Nk, Nv, Dk, Dv,
                       o_ref.data());
    cpu::gdn_recurrent(sc.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), T, Nk, Nv, Dk, Dv,
                       o_cpu.data());
    EXPECT_CLOSE(o_cpu, o_ref, 1e-5);
    EXPECT_CLOSE(sc, sr, 1e-5);
    for (int64_t chunk : {1, 16, 64}) {
      SCOPED_TRACE(chunk);
      auto s1 = c.state, s2 = c.state;
      auto o1 = poisoned(o_ref.size()), o2 = o1;
      ref::gdn_chunked(s1.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), T, Nk, Nv, Dk, Dv,
                       o1.data(), chunk);
      cpu::gdn_chunked(s2.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), T, Nk, Nv, Dk, Dv,
                       o2.data(), chunk);
      EXPECT_CLOSE(o2, o1, 1e-5);    // cpu chunked vs ref chunked
      EXPECT_CLOSE(s2, s1, 1e-5);
      EXPECT_CLOSE(o2, o_cpu, 1e-5);  // cpu chunked vs cpu token-by-token (both fp32)
      EXPECT_CLOSE(s2, sc, 1e-5);
    }
  }
}

TEST_F(CpuVsRef, GdnDecodeStepsEqualOnePrefillCall) {
  // Feeding tokens one call at a time (decode) must continue the state exactly like one call over all.
  auto c = make_gdn_case(9, 2, 4, 16, 8, 420);
  auto s_all = c.state, s_step = c.state;
  auto o_all = poisoned(size_t(c.T * c.Nv * c.Dv)), o_step = o_all;
  cpu::gdn_chunked(s_all.data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), c.T, c.Nk, c.Nv,
                   c.Dk, c.Dv, o_all.data(), 4);
  for (int64_t t = 0; t < c.T; ++t)
    cpu::gdn_recurrent(s_step.data(), c.q.data() + t * c.Nk * c.Dk, c.k.data() + t * c.Nk * c.Dk,
                       c.v.data() + t * c.Nv * c.Dv, c.g.data() + t * c.Nv, c.beta.data() + t * c.Nv, 1, c.Nk, c.Nv,
                       c.Dk, c.Dv, o_step.data() + t * c.Nv * c.Dv);
  EXPECT_CLOSE(o_step, o_all, 1e-5);
  EXPECT_CLOSE(s_step, s_all, 1e-5);
}

TEST_F(CpuVsRef, ResultsDoNotDependOnThreadCount) {
  // Every op assigns each output to exactly one thread with a fixed summation order, so the thread count
  // must not change a single bit.
  const int64_t N = 133, K = 1152, M = 5;
  auto W = random_ternary(N, K, 430);
  auto x = randn(size_t(M * K), 431);
  auto c = make_gdn_case(40, 2, 6, 32, 24, 432);
  const int64_t T = 40, Hq = 24, Hkv = 4, D = 64;
  auto q = randn(size_t(Hq * D), 433), kc = randn(size_t(T * Hkv * D), 434), vc = randn(size_t(T * Hkv * D), 435);
  std::vector<float> y[2], o[2], st[2], att[2];
  for (int pass = 0; pass < 2; ++pass) {
    cpu::set_num_threads(pass == 0 ? 1 : 3);
    y[pass] = poisoned(size_t(M * N));
    cpu::ternary_matmul(W.blocks.data(), N, K, x.data(), M, y[pass].data());
    st[pass] = c.state;
    o[pass] = poisoned(size_t(40 * 6 * 24));
    cpu::gdn_chunked(st[pass].data(), c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(), 40, 2, 6, 32, 24,
                     o[pass].data(), 16);
    att[pass] = poisoned(size_t(Hq * D));
    cpu::attention_decode(q.data(), kc.data(), vc.data(), T, Hq, Hkv, D, 0.125f, att[pass].data());
  }
  EXPECT_EQ(y[0], y[1]);
  EXPECT_EQ(o[0], o[1]);
  EXPECT_EQ(st[0], st[1]);
  EXPECT_EQ(att[0], att[1]);
}
