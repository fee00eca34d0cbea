// The CPU backend's tiled copies of a model's ternary linears (layout: backend/cpu/tiles.h), built once by
// CpuBackend::prepare and found by the canonical TernaryMatrix's address (the rule of backend/backend.h).
//
// Memory: a copy is the size of the canonical blocks (+ padding of partial tiles). For a zero-copy PQ2_0
// view, the mapped pages of each matrix are released (MADV_DONTNEED on a read-only file mapping: the page
// cache keeps the data, a later read of the canonical form faults it back in) as soon as its tiles are
// built, so the process holds ~1x the weights, not 2x. Owned canonical buffers (PTQ1_0 and MLX packs,
// transcoded at load) belong to the Model: by default they stay (the process holds both, so they are tiled only
// when MemAvailable covers their tiles plus 1 GiB; otherwise a note on stderr, and the canonical kernels). With
// `release_owned` (the model's only user is this backend: `bonsai run / chat / bench / gate`) each one's pages are
// returned to the system once its tiles are built (MADV_DONTNEED, then PROT_NONE so that a stray read faults
// loudly instead of reading zeros): PTQ1_0 27b peak RSS 15.2 -> ~8 GB. A released matrix has no canonical form
// any more: released() says so, and the CPU linear refuses a path that would need it with a clear error.
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
  // release_owned: above (only owned buffers of >= 4 MiB, which are whole mappings of their own, and only those no
  // matrix that stays canonical shares, e.g. a tied head's embedding).
  void build(const Model& m, bool release_owned = false);
  // The tiles of w, or nullptr when this holder has none for it (never built, another model, an empty matrix);
  // released (optional): whether w's canonical blocks were returned (below), from the same lookup.
  const uint8_t* find(const TernaryMatrix& w, bool* released = nullptr) const;
  uint64_t bytes() const { return bytes_; }      // tiled bytes held
  double seconds() const { return seconds_; }    // the last build's wall time
  size_t count() const { return by_matrix_.size(); }
  int builds() const { return builds_; }         // how many times build() tiled (not counting kept tiles)
  bool released(const TernaryMatrix& w) const;   // w's canonical blocks were returned (build's release_owned)
  uint64_t released_bytes() const { return released_bytes_; }

 private:
  struct Entry {
    const uint8_t* blocks;               // the canonical blocks it was built from (checked by find)
    int64_t rows, cols;
    std::shared_ptr<const void> keep;    // keeps those blocks alive, so their address cannot be reused
    TiledCopy copy;                      // the tiles (backend/cpu/tiles.h)
    bool released = false;               // the canonical pages were returned (release_owned)
    // Whether these tiles are w's (the same buffer and shape it was built from).
    bool built_from(const TernaryMatrix& w) const { return blocks == w.blocks && rows == w.rows && cols == w.cols; }
  };
  const Entry* entry(const TernaryMatrix& w) const;  // w's entry if it is still w's, else nullptr
  std::unordered_map<const TernaryMatrix*, Entry> by_matrix_;
  uint64_t bytes_ = 0, released_bytes_ = 0;
  double seconds_ = 0;
  int builds_ = 0;
};

}  // namespace bonsai::cpu
