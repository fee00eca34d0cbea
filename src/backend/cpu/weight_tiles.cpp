#include "backend/cpu/weight_tiles.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <vector>

#include "backend/cpu/tiles.h"
#include "util/large_buffer.h"
#include "util/progress.h"

namespace bonsai::cpu {
namespace {

// Drops this process's mapping of the whole pages inside [p, p + n) of a read-only file mapping.
void release_view_pages(const uint8_t* p, uint64_t n) {
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) & ~(page - 1);
  if (b > a) ::madvise(reinterpret_cast<void*>(a), size_t(b - a), MADV_DONTNEED);  // best effort
}

// MemAvailable of /proc/meminfo in bytes; 0 when unknown.
uint64_t mem_available_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  std::fclose(f);
  return uint64_t(kb) * 1024;
}

// The ternary linears: every ternary matrix but the embedding table (read one row per token).
std::vector<const TernaryMatrix*> linears(const Model& m) {
  std::vector<const TernaryMatrix*> out = m.ternary_matrices();
  out.erase(std::remove(out.begin(), out.end(), &m.embed), out.end());
  return out;
}

// Whether another matrix of m reads w's buffer (a tied head and its embedding share one): the embedding is never
// tiled, so such a buffer must stay.
bool shared_with_canonical(const Model& m, const TernaryMatrix& w) {
  for (const TernaryMatrix* o : m.ternary_matrices())
    if (o != &w && o->storage && o->storage == w.storage) return true;
  return false;
}

}  // namespace

void WeightTiles::build(const Model& m, bool release_owned) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<const TernaryMatrix*> ws = linears(m);
  // The same model again (a second Decoder on this backend): its tiles are all here, keep them.
  bool have_all = !by_matrix_.empty();
  for (const TernaryMatrix* w : ws) have_all = have_all && (w->rows == 0 || find(*w) != nullptr);
  if (have_all) return;
  ++builds_;
  // Entries still valid for this model are kept, not rebuilt: a released matrix cannot be tiled again.
  std::unordered_map<const TernaryMatrix*, Entry> prev = std::move(by_matrix_);
  by_matrix_.clear();
  bytes_ = released_bytes_ = 0;
  uint64_t total = 0, owned = 0;
  for (const TernaryMatrix* w : ws) {
    total += w->bytes();
    if (w->owned) owned += w->bytes();
  }
  // A view's pages are released as its tiles are built (net ~0), but an owned canonical buffer stays: its
  // tiles are extra memory. Skip those (they keep the canonical kernels) when they would not fit with a
  // 1 GiB margin, rather than push the machine into the OOM killer.
  // (With release_owned each owned buffer is returned as its tiles are built: net ~0 but one matrix at a time.)
  const uint64_t avail = mem_available_bytes();
  const bool tile_owned = owned == 0 || avail == 0 || release_owned || owned + (uint64_t(1) << 30) <= avail;
  if (!tile_owned) {
    std::fprintf(stderr,
                 "note: not tiling %.2f GB of transcoded weights for the CPU kernels (%.2f GB available): they run "
                 "on the canonical kernels, slower\n",
                 double(owned) / 1e9, double(avail) / 1e9);
    total -= owned;
  }
  Progress progress("tiling weights for the CPU kernels", total, stderr_is_tty() && total > (uint64_t(1) << 30));
  for (const TernaryMatrix* w : ws) {
    if (!w->blocks || w->rows == 0 || w->cols % 128 != 0 || (w->owned && !tile_owned)) continue;
    if (const auto it = prev.find(w); it != prev.end() && it->second.built_from(*w)) {
      bytes_ += tiled_bytes(w->rows, w->cols);
      if (it->second.released) released_bytes_ += w->bytes();
      by_matrix_.emplace(w, std::move(it->second));
      progress.advance(w->bytes());
      continue;
    }
    TiledCopy copy;
    try {
      copy = make_tiled_copy(w->blocks, w->row_runs.data(), int64_t(w->row_runs.size()), w->rows, w->cols);
    } catch (const std::bad_alloc&) {  // out of memory: what is tiled stays, the rest reads the canonical blocks
      std::fprintf(stderr, "note: out of memory tiling %s for the CPU kernels; it and the rest use the canonical kernels\n",
                   w->name.c_str());
      break;
    }
    Entry e{w->blocks, w->rows, w->cols, w->storage, std::move(copy)};
    bytes_ += tiled_bytes(w->rows, w->cols);
    uint64_t stored = 0;  // rows the canonical buffer holds (a row map may store fewer or reorder them)
    for (const RowRun& r : w->row_runs) stored = std::max<uint64_t>(stored, uint64_t(r.src + r.count));
    const uint64_t canon_bytes = std::max<uint64_t>(stored, uint64_t(w->rows)) * w->row_bytes();
    if (!w->owned) {  // a view into the mapped pack: its pages are no longer needed resident
      release_view_pages(w->blocks, canon_bytes);
    } else if (release_owned && w->row_runs.empty() && !shared_with_canonical(m, *w) &&
               HugePageAllocator<uint8_t>::retire_pages(w->blocks, size_t(w->bytes()))) {
      // (An owned buffer with no row map is allocate()'s: exactly bytes() from the huge-page allocator.)
      e.released = true;
      released_bytes_ += w->bytes();
    }
    by_matrix_.emplace(w, std::move(e));
    progress.advance(w->bytes());
  }
  progress.finish();
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const WeightTiles::Entry* WeightTiles::entry(const TernaryMatrix& w) const {
  const auto it = by_matrix_.find(&w);
  return it != by_matrix_.end() && it->second.built_from(w) ? &it->second : nullptr;
}

bool WeightTiles::released(const TernaryMatrix& w) const {
  const Entry* e = entry(w);
  return e && e->released;
}

const uint8_t* WeightTiles::find(const TernaryMatrix& w, bool* released) const {
  const Entry* e = entry(w);
  if (released) *released = e && e->released;
  return e ? e->copy.tiles : nullptr;
}

}  // namespace bonsai::cpu
