// The CPU thread pool: every index exactly once, nested calls, concurrent submitters, resizing.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"

using bonsai::cpu::ThreadPool;

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1000, 100003})
      for (int64_t grain : {1, 3, 64, 100000}) {
        std::vector<std::atomic<int>> hits(size_t(n) + 10);
        pool.parallel_for(5, 5 + n, grain, [&](int64_t lo, int64_t hi) {
          EXPECT_LT(lo, hi);
          for (int64_t i = lo; i < hi; ++i) hits[size_t(i - 5)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << threads << " " << n << " " << grain;
      }
  }
}

TEST(ThreadPool, ManySmallJobsBackToBack) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 20000; ++rep)
    pool.parallel_for(0, 8, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) sum += i;
    });
  EXPECT_EQ(sum.load(), int64_t(20000) * 28);
}

TEST(ThreadPool, NestedCallsRunSerially) {
  ThreadPool pool(3);
  std::atomic<int64_t> count{0};
  pool.parallel_for(0, 16, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      pool.parallel_for(0, 100, 1, [&](int64_t a, int64_t b) { count += b - a; });
  });
  EXPECT_EQ(count.load(), 1600);
}

TEST(ThreadPool, ConcurrentSubmitters) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t)
    ts.emplace_back([&] {
      for (int rep = 0; rep < 500; ++rep)
        pool.parallel_for(0, 1000, 10, [&](int64_t lo, int64_t hi) { total += hi - lo; });
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(total.load(), 3 * 500 * 1000);
}

TEST(ThreadPool, GlobalPoolResizes) {
  bonsai::cpu::set_num_threads(2);
  EXPECT_EQ(bonsai::cpu::num_threads(), 2);
  bonsai::cpu::set_num_threads(1);
  EXPECT_EQ(bonsai::cpu::num_threads(), 1);
  int64_t n = 0;  // one thread: runs inline, no atomics needed
  bonsai::cpu::parallel_for(0, 50, 1, [&](int64_t lo, int64_t hi) { n += hi - lo; });
  EXPECT_EQ(n, 50);
  bonsai::cpu::set_num_threads(0);
  EXPECT_EQ(bonsai::cpu::num_threads(), std::max(1, int(std::thread::hardware_concurrency())));
}
