// A test parameterised over the CPU kernel variants ("avx512vnni", "avx512bw", "avx2", "portable"): each
// case forces its variant (skipped where this CPU cannot run it) and restores the process's choice and
// thread count afterwards.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"

namespace bonsai::test {

class ForcedKernels : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    prev_ = cpu::kernels_name();
    if (!cpu::find_kernels(GetParam())) GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    ASSERT_TRUE(cpu::set_kernels(GetParam()));
  }
  void TearDown() override {
    cpu::set_kernels(prev_.c_str());
    cpu::set_num_threads(0);
  }
  std::string prev_;
};

}  // namespace bonsai::test
