// CpuBackend::Options::release_owned (weight_tiles.h): an owned (transcoded) canonical buffer is returned to the
// system once its tiles are built, and the tiles alone then serve the product.
// - the released buffer's pages are no longer resident (mincore), released() / released_bytes() say so, and the
//   product through the tiles is bit-identical to a backend that kept its canonical copy (q16 and q8, M = 1 and 5);
// - a product that would read the canonical blocks (f32 activations) is refused with an error naming the matrix;
// - buffers that cannot be returned stay: a view of someone else's memory is not owned, a small owned buffer (heap,
//   < 4 MiB) is not a mapping of its own, and a head whose storage the embedding shares (tied) keeps it for the
//   embedding's row reads;
// - without release_owned nothing is released.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "op_test_util.h"
#include "util/error.h"

using namespace bonsai;
using namespace bonsai::test;

namespace {

// Pages of [p, p + n) resident in memory (mincore).
size_t resident_pages(const uint8_t* p, size_t n) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~(uintptr_t(page) - 1);
  const size_t len = (reinterpret_cast<uintptr_t>(p) + n - a + page - 1) / page * page;
  std::vector<unsigned char> v(len / page);
  if (::mincore(reinterpret_cast<void*>(a), len, v.data()) != 0) return size_t(-1);
  size_t r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}

// m's head as an owned copy of t (TernaryMatrix::allocate: the transcoded-pack form).
void own_head(Model& m, const Ternary& t, const char* name) {
  m.head.name = name;
  uint8_t* dst = m.head.allocate(t.N, t.K);
  std::memcpy(dst, t.blocks.data(), t.blocks.size());
}

std::vector<float> product(CpuBackend& be, const TernaryMatrix& w, const std::vector<float>& x, int64_t M) {
  auto y = poisoned(size_t(M * w.rows));
  const LinearOut out{&w, y.data()};
  be.linear(&out, 1, w.cols, x.data(), M);
  return y;
}

struct ActGuard {  // restores the process-wide activation precision
  cpu::TernaryActivation prev = cpu::ternary_activation();
  ~ActGuard() { cpu::set_ternary_activation(prev); }
};

}  // namespace

TEST(CpuRelease, OwnedBuffersServeTheTilesAloneAndRefuseTheCanonicalPath) {
  if (!cpu::kernels().ternary_tiles_q8_x1) GTEST_SKIP() << cpu::kernels_name() << " kernels read no tiles";
  ActGuard guard;
  cpu::set_ternary_activation(cpu::TernaryActivation::q16);
  const Ternary t = random_ternary(4096, 4096, 71);  // 4.46 MB of blocks: an owned buffer is a mapping of its own
  Model kept_m, rel_m;
  own_head(kept_m, t, "output.weight");
  own_head(rel_m, t, "output.weight");
  CpuBackend::Options keep_o, rel_o;
  rel_o.release_owned = true;
  CpuBackend kept(keep_o), rel(rel_o);
  kept.prepare(kept_m);
  ASSERT_GT(resident_pages(rel_m.head.blocks, size_t(rel_m.head.bytes())), 0u);
  rel.prepare(rel_m);
  EXPECT_FALSE(kept.weight_tiles().released(kept_m.head));
  EXPECT_EQ(kept.weight_tiles().released_bytes(), 0u);
  ASSERT_TRUE(rel.weight_tiles().released(rel_m.head));
  EXPECT_EQ(rel.weight_tiles().released_bytes(), rel_m.head.bytes());
  EXPECT_EQ(resident_pages(rel_m.head.blocks, size_t(rel_m.head.bytes())), 0u) << "the pages went back";
  ASSERT_NE(rel.weight_tiles().find(rel_m.head), nullptr);
  // A second prepare of the same model keeps the tiles (it could not tile the returned pages again).
  rel.prepare(rel_m);
  EXPECT_TRUE(rel.weight_tiles().released(rel_m.head));
  for (auto act : {cpu::TernaryActivation::q16, cpu::TernaryActivation::q8}) {
    cpu::set_ternary_activation(act);
    for (int64_t M : {1, 5}) {
      const auto x = randn(size_t(M * t.K), 72 + uint32_t(M));
      const auto a = product(kept, kept_m.head, x, M), b = product(rel, rel_m.head, x, M);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), 4 * a.size())) << "act " << int(act) << " M " << M;
    }
  }
  // f32 activations read the canonical blocks: refused, naming the matrix.
  cpu::set_ternary_activation(cpu::TernaryActivation::f32);
  const auto x = randn(size_t(t.K), 73);
  try {
    product(rel, rel_m.head, x, 1);
    ADD_FAILURE() << "an f32 product of a released matrix ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("output.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("release_owned"), std::string::npos) << e.what();
  }
  // The backend that kept its copy still runs it.
  const auto y = product(kept, kept_m.head, x, 1);
  for (float v : y) ASSERT_TRUE(std::isfinite(v));
}

TEST(CpuRelease, BuffersThatCannotBeReturnedStay) {
  if (!cpu::kernels().ternary_tiles_q8_x1) GTEST_SKIP() << cpu::kernels_name() << " kernels read no tiles";
  ActGuard guard;
  cpu::set_ternary_activation(cpu::TernaryActivation::q16);
  CpuBackend::Options o;
  o.release_owned = true;
  // A view (the zero-copy PQ2_0 form, here of this test's own vector): not owned.
  {
    const Ternary t = random_ternary(4096, 4096, 74);
    Model m;
    m.head.name = "output.weight";
    m.head.rows = t.N;
    m.head.cols = t.K;
    auto keep = std::make_shared<std::vector<uint8_t>>(t.blocks);
    m.head.view(keep->data(), keep);
    CpuBackend be(o);
    be.prepare(m);
    EXPECT_NE(be.weight_tiles().find(m.head), nullptr);
    EXPECT_FALSE(be.weight_tiles().released(m.head));
  }
  // A small owned buffer (< 4 MiB: from the heap, not a mapping of its own).
  {
    const Ternary t = random_ternary(256, 1024, 75);
    Model m;
    own_head(m, t, "output.weight");
    CpuBackend be(o);
    be.prepare(m);
    EXPECT_NE(be.weight_tiles().find(m.head), nullptr);
    EXPECT_FALSE(be.weight_tiles().released(m.head));
  }
  // A tied head: the embedding (read row by row, never tiled) shares its storage.
  {
    const Ternary t = random_ternary(4096, 4096, 76);
    Model m;
    own_head(m, t, "token_embd.weight");
    m.embed = m.head;
    CpuBackend be(o);
    be.prepare(m);
    EXPECT_NE(be.weight_tiles().find(m.head), nullptr);
    EXPECT_FALSE(be.weight_tiles().released(m.head));
    std::vector<float> row(size_t(t.K));
    const int32_t id = 4000;
    be.embed_rows(m.embed, &id, 1, row.data());  // still readable
    for (float v : row) ASSERT_TRUE(std::isfinite(v));
  }
}
