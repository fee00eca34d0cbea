#include <gtest/gtest.h>

#include <filesystem>

#include "model/pack.h"
#include "pack/make_pack.h"

using namespace bonsai;

TEST(MakePack, TinyWritesEveryFormat) {
  MakePackOptions o;
  o.out_dir = testing::TempDir() + "/mp_smoke";
  const auto r = make_pack(o);
  ASSERT_EQ(r.paths.size(), 4u);
  for (const auto& p : r.paths) EXPECT_TRUE(std::filesystem::exists(p)) << p;
}
