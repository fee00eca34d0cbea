// load_model: builds the canonical Model from a checked pack, applying the format's conventions (GGUF
// tiled GDN V order -> grouped, MLX A_log -> A, PTQ1_0 / MLX -> PQ2_0 blocks) exactly once. GGUF PQ2_0
// matrices are views into the mapped file (zero copy); everything else is copied.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include <sys/mman.h>

#include "format/ternary_codec.h"
#include "model/pack.h"
#include "util/error.h"
#include "util/half.h"
#include "util/progress.h"

namespace bonsai {

namespace {

// Run fn(begin, end) over [0, n) on up to `threads` threads.
template <typename Fn>
void parallel_rows(int64_t n, int threads, Fn&& fn) {
  threads = std::max(1, std::min<int>(threads, int((n + 255) / 256)));
  if (threads == 1) return fn(int64_t(0), n);
  std::vector<std::thread> pool;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&, b, e] { fn(b, e); });
  }
  for (auto& th : pool) th.join();
}

std::vector<float> to_f32(const uint8_t* data, uint64_t n, bool is_gguf, uint32_t ggml_t, StDtype st) {
  std::vector<float> out(n);
  const bool f16 = is_gguf ? ggml_t == ggml_type::F16 : st == StDtype::F16;
  const bool bf16 = is_gguf ? ggml_t == ggml_type::BF16 : st == StDtype::BF16;
  for (uint64_t i = 0; i < n; ++i) {
    if (f16 || bf16) {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      out[i] = f16 ? fp16_to_f32(h) : bf16_to_f32(h);
    } else {
      std::memcpy(&out[i], data + 4 * i, 4);
    }
  }
  return out;
}

struct Loader {
  const Pack& pack;
  const PackCheck& pc;
  const LoadOptions& opt;
  Model& m;
  int threads;
  Progress* progress;

  const ModelConfig& c() const { return pc.config; }

  // Which canonical row comes from which file row for the GDN tensors the GGUF converter tiled.
  // rows_per_head: rows of one V head in this block; head_base: first row of the V block.
  void tiled_rows_to_grouped(std::vector<int64_t>& src_row, int64_t head_base, int64_t rows_per_head) const {
    const int64_t Nk = c().gdn_k_heads, Nv = c().gdn_v_heads;
    for (int64_t g = 0; g < Nv; ++g) {
      const int64_t t = gdn_grouped_to_tiled(g, Nk, Nv);
      for (int64_t r = 0; r < rows_per_head; ++r) src_row[size_t(head_base + g * rows_per_head + r)] = head_base + t * rows_per_head + r;
    }
  }

  // Row map of a tensor: canonical row i comes from file row src_row[i].
  std::vector<int64_t> row_map(const TensorSource& s) const {
    const int64_t N = s.spec->rows();
    std::vector<int64_t> rows(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) rows[size_t(i)] = i;
    if (!pc.gdn_tiled_in_file) return rows;
    const int64_t Dv = c().gdn_head_dim;
    switch (s.spec->role) {
      case Role::GdnQkv: tiled_rows_to_grouped(rows, 2 * c().gdn_key_dim(), Dv); break;
      case Role::GdnGate: tiled_rows_to_grouped(rows, 0, Dv); break;
      case Role::GdnAlpha: case Role::GdnBeta: tiled_rows_to_grouped(rows, 0, 1); break;
      default: break;
    }
    return rows;
  }

  // Row map as runs (format/ternary_codec.h RowRun); empty when every row stays in place.
  static std::vector<RowRun> runs_of(const std::vector<int64_t>& rows) {
    std::vector<RowRun> runs;
    for (int64_t i = 0; i < int64_t(rows.size()); ++i) {
      if (!runs.empty() && runs.back().src + runs.back().count == rows[size_t(i)]) ++runs.back().count;
      else runs.push_back({i, rows[size_t(i)], 1});
    }
    if (runs.size() == 1 && runs[0].src == 0) return {};
    return runs;
  }

  // Unfolded GDN out_proj of a tiled GGUF: whole scale groups per head can be permuted (exact) in a copy.
  bool untile_column_groups(const TensorSource& s) const {
    return s.spec->role == Role::GdnOut && pc.gdn_tiled_in_file && !s.folded && c().gdn_head_dim % 128 == 0;
  }

  TernaryMatrix ternary(const TensorSource& s) {
    TernaryMatrix t;
    t.name = s.spec->gguf_name;
    t.rows = s.spec->rows();
    t.cols = s.spec->cols();
    t.folded = s.folded;
    const int64_t N = t.rows, K = t.cols, G = K / 128;
    const std::vector<int64_t> rows = row_map(s);
    const bool untile_groups = untile_column_groups(s);
    const MappedFile* map = pack.gguf ? pack.gguf->mapping() : nullptr;
    if (pack.gguf && s.ggml_type == ggml_type::PQ2_0 && map && !untile_groups) {
      // Zero copy: the file's PQ2_0 blocks are the canonical layout. Tiled rows are read in place through
      // a row map (measured: copying the 1.07 GB of reordered GDN rows of the 27b pack cost 0.5-1.6 s here,
      // mostly the kernel zeroing fresh pages, against a 1.3 s read of the whole file). The pages are made
      // resident now, so the load time includes the read and the first token does not pay for it.
      t.view(s.data, std::shared_ptr<const void>(pack.gguf->shared_mapping()));
      t.row_runs = runs_of(rows);
      map->populate(uint64_t(s.data - pack.gguf->file_data()), s.nbytes);
      if (progress) progress->advance(s.nbytes);
    } else {
      uint8_t* dst = t.allocate(N, K);  // [N, K/128, 34]
      const uint64_t row_bytes = t.row_bytes();
      if (pack.gguf) {
        if (map) map->advise_sequential(uint64_t(s.data - pack.gguf->file_data()), s.nbytes);
        const bool pq2 = s.ggml_type == ggml_type::PQ2_0;
        const uint64_t src_row_bytes = uint64_t(G) * (pq2 ? kPq2Bytes : kPtq1Bytes);
        parallel_rows(N, threads, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            const uint8_t* src = s.data + uint64_t(rows[size_t(i)]) * src_row_bytes;
            if (pq2) std::memcpy(dst + uint64_t(i) * row_bytes, src, row_bytes);
            else ptq1_to_pq2(src, 1, uint64_t(K), dst + uint64_t(i) * row_bytes);
          }
        });
      } else {
        // MLX: words u32 [N, K/16] (group i's 32 code bytes at 32 i) + scales fp16 [N, K/128] interleaved
        // into blocks; byte copies, so no alignment is assumed of the safetensors data.
        const uint8_t* sc = s.mlx_scales->data;
        const uint8_t* bi = s.mlx_biases->data;
        mlx_check_biases(reinterpret_cast<const uint16_t*>(sc), reinterpret_cast<const uint16_t*>(bi), uint64_t(N), uint64_t(K),
                         pack.path + ": " + s.file_name);
        parallel_rows(N, threads, [&](int64_t b, int64_t e) {
          for (uint64_t i = uint64_t(b * G); i < uint64_t(e * G); ++i) {
            std::memcpy(dst + i * kPq2Bytes, sc + 2 * i, 2);
            std::memcpy(dst + i * kPq2Bytes + 2, s.data + 32 * i, 32);
          }
        });
      }
      if (untile_groups) untile_columns(t, dst);
      release(s);
    }
    // ssm_out: input columns. Grouped when folded with gdn_v_grouped; otherwise tiled.
    if (s.spec->role == Role::GdnOut && pc.gdn_tiled_in_file && !(s.folded && pc.contract.gdn_v_grouped) && !untile_groups)
      set_input_perm(t);
    return t;
  }

  // Columns of an unfolded GDN out_proj with whole scale groups per head (dst: t's owned blocks
  // [N, K/128, 34]): permute the blocks of each row from tiled to grouped V-head order (exact).
  void untile_columns(TernaryMatrix& t, uint8_t* dst) const {
    const int64_t Nk = c().gdn_k_heads, Nv = c().gdn_v_heads, bph = c().gdn_head_dim / 128;
    const size_t head_bytes = size_t(bph) * kPq2Bytes;
    std::vector<uint8_t> row(t.row_bytes());  // one row [K/128, 34]
    for (int64_t r = 0; r < t.rows; ++r) {
      uint8_t* rb = dst + uint64_t(r) * t.row_bytes();
      std::memcpy(row.data(), rb, row.size());
      for (int64_t g = 0; g < Nv; ++g)
        std::memcpy(rb + size_t(g) * head_bytes, row.data() + size_t(gdn_grouped_to_tiled(g, Nk, Nv)) * head_bytes, head_bytes);
    }
  }

  // Folded (or heads that split scale groups): the activation is gathered into tiled order before the
  // transform, so the weights stay as stored.
  void set_input_perm(TernaryMatrix& t) const {
    const int64_t Nk = c().gdn_k_heads, Nv = c().gdn_v_heads, Dv = c().gdn_head_dim;
    t.input_perm.resize(size_t(t.cols));
    for (int64_t tt = 0; tt < Nv; ++tt) {
      const int64_t g = gdn_tiled_to_grouped(tt, Nk, Nv);
      for (int64_t d = 0; d < Dv; ++d) t.input_perm[size_t(tt * Dv + d)] = int32_t(g * Dv + d);
    }
  }

  std::vector<float> floats(const TensorSource& s) {
    const uint64_t n = uint64_t(s.spec->rows() * s.spec->cols());
    std::vector<float> v = to_f32(s.data, n, pack.gguf != nullptr, s.ggml_type, s.mlx_dtype);
    release(s);
    return v;
  }

  // Vector whose entries are GDN V heads (ssm_a, dt_bias): untile.
  std::vector<float> head_vector(const TensorSource& s) {
    std::vector<float> v = floats(s);
    if (!pc.gdn_tiled_in_file) return v;
    std::vector<float> out(v.size());
    for (int64_t g = 0; g < c().gdn_v_heads; ++g) out[size_t(g)] = v[size_t(gdn_grouped_to_tiled(g, c().gdn_k_heads, c().gdn_v_heads))];
    return out;
  }

  std::vector<float> dense_rows(const TensorSource& s) {
    std::vector<float> v = floats(s);
    const std::vector<int64_t> rows = row_map(s);
    const int64_t K = s.spec->cols();
    std::vector<float> out(v.size());
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(&out[i * size_t(K)], &v[size_t(rows[i] * K)], size_t(K) * 4);
    return out;
  }

  // Conv taps [C, Kc]: V channels are tiled in GGUF.
  std::vector<float> conv(const TensorSource& s) {
    std::vector<float> v = floats(s);
    if (!pc.gdn_tiled_in_file) return v;
    const int64_t Kc = c().conv_kernel, Dv = c().gdn_head_dim, base = 2 * c().gdn_key_dim();
    std::vector<float> out = v;
    for (int64_t g = 0; g < c().gdn_v_heads; ++g) {
      const int64_t t = gdn_grouped_to_tiled(g, c().gdn_k_heads, c().gdn_v_heads);
      std::memcpy(&out[size_t((base + g * Dv) * Kc)], &v[size_t((base + t * Dv) * Kc)], size_t(Dv * Kc) * 4);
    }
    return out;
  }

  void release(const TensorSource& s) {
    if (progress) progress->advance(s.nbytes + (s.mlx_scales ? s.mlx_scales->nbytes * 2 : 0));
    if (!opt.release_pages || !pack.gguf || !pack.gguf->mapping()) return;
    pack.gguf->mapping()->release(uint64_t(s.data - pack.gguf->file_data()), s.nbytes);
  }
};

}  // namespace

const int8_t* HadamardRotation::signs_for(int64_t K) const {
  if (!enabled || !explicit_signs) return nullptr;
  for (size_t i = 0; i < widths.size(); ++i)
    if (widths[i] == K) return signs[i].data();
  fail("no Hadamard sign vector of width {}", K);
}

Model load_model(const Pack& pack, const LoadOptions& opt) {
  const PackCheck pc = check_pack(pack);
  if (!pc.valid()) {
    std::string all;
    for (const auto& p : pc.problems) all += "\n  - " + p;
    fail("{}: invalid pack ({} problem{}):{}", pack.path, pc.problems.size(), pc.problems.size() == 1 ? "" : "s", all);
  }
  Model m;
  m.config = pc.config;
  m.source_path = pack.path;
  const ModelConfig& c = m.config;
  if (pack.gguf) {
    uint32_t tt = 0;
    for (const auto& s : pc.sources)
      if (s.spec->role == Role::TokenEmbd) tt = s.ggml_type;
    m.source_format = tt == ggml_type::PTQ1_0 ? "gguf-ptq1_0" : "gguf-pq2_0";
  } else {
    m.source_format = "mlx";
  }
  const HadamardContract& h = pc.contract;
  if (h.present) {
    m.hadamard.enabled = true;
    m.hadamard.block = h.block_size;
    m.hadamard.explicit_signs = h.sign_mode == "explicit";
    for (int64_t w : h.sign_widths) {
      m.hadamard.widths.push_back(w);
      m.hadamard.signs.push_back(h.signs.count(w) ? h.signs.at(w) : std::vector<int8_t>());
    }
  }
  uint64_t total = 0;
  for (const auto& s : pc.sources) total += s.nbytes + (s.mlx_scales ? s.mlx_scales->nbytes * 2 : 0);
  Progress progress("loading", total, opt.progress);
  const int threads = opt.threads > 0 ? opt.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  Loader L{pack, pc, opt, m, threads, opt.progress ? &progress : nullptr};
  m.layers.resize(size_t(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) m.layers[size_t(i)].full_attention = c.full_attention[size_t(i)];
  bool have_head = false;
  for (const TensorSource& s : pc.sources) {
    LayerWeights* L_ = s.spec->layer >= 0 ? &m.layers[size_t(s.spec->layer)] : nullptr;
    switch (s.spec->role) {
      case Role::TokenEmbd: m.embed = L.ternary(s); m.embed_inverse = s.inverse; break;
      case Role::OutputNorm: m.out_norm = L.floats(s); break;
      case Role::Output: m.head = L.ternary(s); have_head = true; break;
      case Role::AttnNorm: L_->attn_norm = L.floats(s); break;
      case Role::PostAttnNorm: L_->post_norm = L.floats(s); break;
      case Role::FfnGate: L_->gate = L.ternary(s); break;
      case Role::FfnUp: L_->up = L.ternary(s); break;
      case Role::FfnDown: L_->down = L.ternary(s); break;
      case Role::AttnQ: L_->attn.q = L.ternary(s); break;
      case Role::AttnK: L_->attn.k = L.ternary(s); break;
      case Role::AttnV: L_->attn.v = L.ternary(s); break;
      case Role::AttnOutput: L_->attn.o = L.ternary(s); break;
      case Role::AttnQNorm: L_->attn.q_norm = L.floats(s); break;
      case Role::AttnKNorm: L_->attn.k_norm = L.floats(s); break;
      case Role::GdnQkv: L_->gdn.qkv = L.ternary(s); break;
      case Role::GdnGate: L_->gdn.z = L.ternary(s); break;
      case Role::GdnOut: L_->gdn.out = L.ternary(s); break;
      case Role::GdnAlpha: L_->gdn.a = L.dense_rows(s); break;
      case Role::GdnBeta: L_->gdn.b = L.dense_rows(s); break;
      case Role::GdnDtBias: L_->gdn.dt_bias = L.head_vector(s); break;
      case Role::GdnNorm: L_->gdn.norm = L.floats(s); break;
      case Role::GdnConv: L_->gdn.conv = L.conv(s); break;
      case Role::GdnA: {
        std::vector<float> v = L.head_vector(s);
        for (size_t k = 0; k < v.size(); ++k) {
          if (!pack.gguf) v[k] = a_from_a_log(v[k]);  // MLX stores A_log
          if (!(v[k] < 0.f) || !std::isfinite(v[k]))
            fail("{}: tensor '{}' gives A[{}] = {}, expected a negative finite decay rate (-exp(A_log))", pack.path, s.file_name, k, v[k]);
        }
        L_->gdn.A = std::move(v);
        break;
      }
    }
  }
  if (!have_head) {
    // Tied head: the table's rows are R e, and R^T R = I, so the same matrix read with the forward
    // transform computes E h: the tied table serves as a folded head as stored.
    m.head = m.embed;  // shares the storage, no copy
    m.head.name = "output.weight (tied to token_embd.weight)";
    m.head.folded = m.embed_inverse;
  }
  progress.finish();
  return m;
}

Model load_model(const std::string& path, const LoadOptions& opt) { return load_model(open_pack(path), opt); }

}  // namespace bonsai
