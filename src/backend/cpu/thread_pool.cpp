#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BONSAI_CPU_RELAX() _mm_pause()
#else
#define BONSAI_CPU_RELAX() std::this_thread::yield()
#endif

namespace bonsai::cpu {
namespace {

thread_local bool tl_in_job = false;  // inside a chunk (or a worker thread): nested parallel_for runs serially

constexpr uint64_t pack(uint32_t gen, uint64_t next, uint64_t count) {
  return (uint64_t(gen) << 32) | (next << 16) | count;
}

// How long an idle worker spins before sleeping. Ops of one decode step arrive microseconds apart;
// longer idle periods (between requests) sleep on a futex and cost nothing.
constexpr auto kSpinFor = std::chrono::microseconds(50);

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(size_t(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_main(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  signal_.fetch_add(1);
  signal_.notify_all();
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::drain() {
  int64_t ran = 0;
  uint64_t w = work_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t next = (w >> 16) & 0xffff, count = w & 0xffff;
    if (next >= count) return ran;
    if (!work_.compare_exchange_weak(w, w + (uint64_t(1) << 16), std::memory_order_acq_rel,
                                     std::memory_order_acquire))
      continue;  // w was reloaded
    // The chunk `next` of the job published with `w` is ours; the job's fields stay put until done_
    // reaches its chunk count, which cannot happen before we add ours.
    const int64_t lo = begin_ + int64_t(next) * chunk_;
    const int64_t hi = std::min(end_, lo + chunk_);
    tramp_(ctx_, lo, hi);
    done_.fetch_add(1, std::memory_order_acq_rel);
    ++ran;
    w = work_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_main() {
  tl_in_job = true;
  uint32_t seen = 0;
  for (;;) {
    uint32_t s = signal_.load(std::memory_order_acquire);
    if (s == seen) {
      const auto until = std::chrono::steady_clock::now() + kSpinFor;
      for (int i = 0; (s = signal_.load(std::memory_order_acquire)) == seen; ++i) {
        BONSAI_CPU_RELAX();
        if ((i & 63) == 63 && std::chrono::steady_clock::now() > until) break;
      }
    }
    if (s == seen) {
      sleepers_.fetch_add(1);
      while ((s = signal_.load()) == seen) signal_.wait(seen);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = s;
    drain();
  }
}

void ThreadPool::run(int64_t begin, int64_t end, int64_t grain, Trampoline tramp, void* ctx) {
  if (end <= begin) return;
  const int64_t total = end - begin;
  grain = std::max<int64_t>(1, grain);
  int64_t nchunks = std::min<int64_t>({(total + grain - 1) / grain, int64_t(n_threads_) * 8, kMaxChunks});
  if (n_threads_ == 1 || nchunks <= 1 || tl_in_job) {
    tramp(ctx, begin, end);
    return;
  }
  std::lock_guard<std::mutex> lock(submit_mu_);
  const int64_t chunk = (total + nchunks - 1) / nchunks;
  nchunks = (total + chunk - 1) / chunk;  // every chunk non-empty
  tramp_ = tramp;
  ctx_ = ctx;
  begin_ = begin;
  end_ = end;
  chunk_ = chunk;
  done_.store(0, std::memory_order_relaxed);
  ++gen_;
  work_.store(pack(gen_, 0, uint64_t(nchunks)), std::memory_order_release);
  signal_.store(gen_);
  if (sleepers_.load() > 0) signal_.notify_all();

  tl_in_job = true;
  drain();
  tl_in_job = false;
  for (int i = 0; done_.load(std::memory_order_acquire) < nchunks; ++i) {
    BONSAI_CPU_RELAX();
    if (i > 4096) std::this_thread::yield();  // a worker was descheduled mid-chunk: give it the core
  }
}

namespace {
std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool_owner;
std::atomic<ThreadPool*> g_pool{nullptr};

int default_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }
}  // namespace

ThreadPool& pool() {
  ThreadPool* p = g_pool.load(std::memory_order_acquire);
  if (p) return *p;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool_owner) {
    g_pool_owner = std::make_unique<ThreadPool>(default_threads());
    g_pool.store(g_pool_owner.get(), std::memory_order_release);
  }
  return *g_pool_owner;
}

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (n <= 0) n = default_threads();
  if (g_pool_owner && g_pool_owner->num_threads() == n) return;
  g_pool.store(nullptr, std::memory_order_release);
  g_pool_owner.reset();
  g_pool_owner = std::make_unique<ThreadPool>(n);
  g_pool.store(g_pool_owner.get(), std::memory_order_release);
}

int num_threads() { return pool().num_threads(); }

}  // namespace bonsai::cpu
