// A small fixed-size thread pool for the CPU backend's ops.
//
// - N threads in total: the calling thread plus N-1 workers, so an op never uses more cores than asked
//   (no oversubscription; default N = std::thread::hardware_concurrency()).
// - parallel_for(begin, end, grain, fn) splits [begin, end) into at most kMaxChunks chunks of at least
//   `grain` indices; fn(lo, hi) runs once per chunk; chunks are claimed dynamically (an atomic counter),
//   which balances uneven work (causal attention rows) and a machine shared with other processes.
// - No allocation per call: the callable is passed by pointer + trampoline, never a std::function.
// - Work that fits in one chunk runs inline on the caller; a parallel_for issued from inside a chunk
//   (nested) runs serially on that thread.
// - Idle workers spin briefly (ops arrive back to back during a decode step) and then sleep on a futex
//   (std::atomic::wait), so an idle pool costs no CPU.
// - Calls from several external threads are serialised by a mutex.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace bonsai::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1, the caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return n_threads_; }

  // fn(int64_t lo, int64_t hi) over [begin, end) in chunks of >= grain (grain >= 1).
  template <class F>
  void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(begin, end, grain,
        [](void* ctx, int64_t lo, int64_t hi) { (*static_cast<Fn*>(ctx))(lo, hi); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  static constexpr int64_t kMaxChunks = 4096;

 private:
  using Trampoline = void (*)(void*, int64_t, int64_t);
  void run(int64_t begin, int64_t end, int64_t grain, Trampoline tramp, void* ctx);
  void worker_main();
  // Claims and runs chunks of the current job until none are left; returns how many it ran.
  int64_t drain();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex submit_mu_;

  // The current job. Written by the submitter only while no chunk is outstanding, published by the
  // release store to work_; read by a worker only after it has claimed a chunk of that job.
  Trampoline tramp_ = nullptr;
  void* ctx_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunk_ = 1;

  // work_ = gen (32 bits) | next chunk index (16 bits) | chunk count (16 bits). Claiming a chunk is one
  // CAS on this word, so a worker can never claim a chunk of a job other than the one it read.
  std::atomic<uint64_t> work_{0};
  std::atomic<int64_t> done_{0};        // chunks finished for the current job
  std::atomic<uint32_t> signal_{0};     // generation; workers sleep on it
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  uint32_t gen_ = 0;
};

// The process-wide pool the CPU ops use.
ThreadPool& pool();
// Rebuilds the global pool with n threads (n <= 0: hardware_concurrency). Call it while no op is running.
void set_num_threads(int n);
int num_threads();

template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& fn) {
  pool().parallel_for(begin, end, grain, std::forward<F>(fn));
}

}  // namespace bonsai::cpu
