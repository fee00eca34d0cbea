// LargeVector<T>: std::vector with an allocator for multi-GB weight buffers.
// - Big allocations (>= 4 MiB) come straight from mmap, 2 MiB aligned, with MADV_HUGEPAGE: on this
//   class of VM a first-touch 4 KiB page fault costs microseconds, and a 7 GB model has 1.8 M of them;
//   in 2 MiB pages it has 3.5 K.
// - Elements are default-initialised, not zeroed, by resize(): the loader overwrites every byte anyway,
//   and a zero-fill would be one more full pass over the memory (the kernel already hands out zeroed pages).
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace bonsai {

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t(2) << 20;
  static constexpr size_t kThreshold = size_t(4) << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kThreshold) return static_cast<T*>(::operator new(bytes));
    // Over-allocate by one huge page so the start can be aligned; the offset is recoverable from the
    // size at deallocate (mmap returns page-aligned addresses, so we store nothing).
    const size_t span = round_up(bytes) + kHuge;
    void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const uintptr_t base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + kHuge - 1) & ~(uintptr_t(kHuge) - 1);
    // Trim the unaligned head and the unused tail so the mapping is exactly [aligned, aligned + round_up(bytes)).
    if (aligned > base) ::munmap(raw, aligned - base);
    const uintptr_t end = base + span, used_end = aligned + round_up(bytes);
    if (end > used_end) ::munmap(reinterpret_cast<void*>(used_end), end - used_end);
    ::madvise(reinterpret_cast<void*>(aligned), round_up(bytes), MADV_HUGEPAGE);  // best effort
    return reinterpret_cast<T*>(aligned);
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kThreshold) return ::operator delete(p);
    ::munmap(p, round_up(bytes));
  }
  // Default-initialise (no zero fill) on resize(n); value-construct when given arguments.
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }

  // For an allocation of `bytes` at p that came from allocate(): returns its pages to the system and makes them
  // unreadable (a later read faults instead of seeing zeros); the mapping stays until deallocate. Only allocations
  // that are mappings of their own (>= kThreshold); false for heap ones or when the calls fail.
  static bool retire_pages(const void* p, size_t bytes) noexcept {
    if (bytes < kThreshold || reinterpret_cast<uintptr_t>(p) % kHuge != 0) return false;
    void* a = const_cast<void*>(p);
    return ::madvise(a, round_up(bytes), MADV_DONTNEED) == 0 && ::mprotect(a, round_up(bytes), PROT_NONE) == 0;
  }

 private:
  static size_t round_up(size_t b) { return (b + kHuge - 1) & ~(kHuge - 1); }
};

template <typename T>
using LargeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace bonsai
