// The CPU backend's tiled copies of a model's ternary linears (layout: backend/cpu/tiles.h), built once by
// CpuBackend::prepare and found by the canonical TernaryMatrix's address (the rule of backend/backend.h).
//
// Memory: a copy is the size of the canonical blocks (+ padding of partial tiles). For a zero-copy PQ2_0
// view, the mapped pages of each matrix are released (MADV_DONTNEED on a read-only file mapping: the page
// cache keeps the data, a later read of the canonical form faults it back in) as soon as its tiles are
// built, so the process holds ~1x the weights, not 2x. Owned canonical buffers (PTQ1_0 and MLX packs,
// transcoded at load) belong to the Model and stay: there the process holds both, so they are tiled only when
// MemAvailable covers their tiles plus 1 GiB (otherwise a note on stderr, and the canonical kernels).
#pragma once
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "model/weights.h"
#include "backend/cpu/tiles.h"

namespace bonsai::cpu {

class WeightTiles {
 public:
  // Tiles every ternary linear of `m` (the embedding table is read row by row and stays canonical; a tied
  // head gets its own tiles). Replaces what an earlier build for another model held; for a model whose tiles
  // are all here already it does nothing. Progress on stderr when it is a terminal.
  void build(const Model& m);
  // The tiles of w, or nullptr when this holder has none for it (never built, another model, an empty matrix).
  const uint8_t* find(const TernaryMatrix& w) const;
  uint64_t bytes() const { return bytes_; }      // tiled bytes held
  double seconds() const { return seconds_; }    // the last build's wall time
  size_t count() const { return by_matrix_.size(); }
  int builds() const { return builds_; }         // how many times build() tiled (not counting kept tiles)

 private:
  struct Entry {
    const uint8_t* blocks;               // the canonical blocks it was built from (checked by find)
    int64_t rows, cols;
    std::shared_ptr<const void> keep;    // keeps those blocks alive, so their address cannot be reused
    TiledCopy copy;                      // the tiles (backend/cpu/tiles.h)
  };
  std::unordered_map<const TernaryMatrix*, Entry> by_matrix_;
  uint64_t bytes_ = 0;
  double seconds_ = 0;
  int builds_ = 0;
};

}  // namespace bonsai::cpu
