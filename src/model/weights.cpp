#include "model/weights.h"

#include <algorithm>
#include <cstring>

#include "model/pack.h"
#include "model/tensor_names.h"
#include "util/error.h"
#include "util/large_buffer.h"

namespace bonsai {

int64_t TernaryMatrix::stored_row(int64_t r) const {
  return bonsai::stored_row(row_runs.data(), int64_t(row_runs.size()), r);
}

uint8_t* TernaryMatrix::allocate(int64_t n_rows, int64_t n_cols) {
  if (n_cols % kTernaryGroup != 0) fail("{}: K = {} is not a multiple of {}", name, n_cols, kTernaryGroup);
  rows = n_rows;
  cols = n_cols;
  auto buf = std::make_shared<LargeVector<uint8_t>>();
  buf->resize(size_t(bytes()));  // not zero-filled: the caller writes every block
  uint8_t* p = buf->data();
  blocks = p;
  storage = std::move(buf);
  owned = true;
  row_runs.clear();
  return p;
}

void TernaryMatrix::view(const uint8_t* data, std::shared_ptr<const void> owner) {
  blocks = data;
  storage = std::move(owner);
  owned = false;
}

void TernaryMatrix::assign_split(const uint32_t* words, const uint16_t* scales, int64_t n_rows, int64_t n_cols) {
  uint8_t* dst = allocate(n_rows, n_cols);
  canonical_to_pq2(words, scales, uint64_t(n_rows), uint64_t(n_cols), dst);
}

std::vector<const TernaryMatrix*> Model::ternary_matrices() const {
  std::vector<const TernaryMatrix*> v{&embed};
  for (const LayerWeights& l : layers) {
    if (l.full_attention) {
      for (const TernaryMatrix* t : {&l.attn.q, &l.attn.k, &l.attn.v, &l.attn.o}) v.push_back(t);
    } else {
      for (const TernaryMatrix* t : {&l.gdn.qkv, &l.gdn.z, &l.gdn.out}) v.push_back(t);
    }
    for (const TernaryMatrix* t : {&l.gate, &l.up, &l.down}) v.push_back(t);
  }
  v.push_back(&head);
  return v;
}

uint64_t Model::total_weight_bytes() const {
  uint64_t b = 0;
  for (const TernaryMatrix* t : ternary_matrices()) b += t->bytes();
  auto fv = [](const std::vector<float>& x) { return uint64_t(x.size()) * 4; };
  b += fv(out_norm);
  for (const LayerWeights& l : layers)
    b += fv(l.attn_norm) + fv(l.post_norm) + fv(l.attn.q_norm) + fv(l.attn.k_norm) + fv(l.gdn.a) + fv(l.gdn.b) +
         fv(l.gdn.A) + fv(l.gdn.dt_bias) + fv(l.gdn.conv) + fv(l.gdn.norm);
  return b;
}

uint64_t Model::decode_weight_bytes() const {
  // One embedding row is read per token instead of the whole table.
  const uint64_t row = embed.rows ? embed.bytes() / uint64_t(embed.rows) : 0;
  return total_weight_bytes() - embed.bytes() + row;
}

namespace {

template <typename V>
bool same(const V& a, const V& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

// Same canonical rows (through each one's row map), whatever holds them (a view or an owned buffer).
bool same_ternary(const TernaryMatrix& a, const TernaryMatrix& b) {
  if (a.rows != b.rows || a.cols != b.cols || a.folded != b.folded || !same(a.input_perm, b.input_perm)) return false;
  for (int64_t r = 0; r < a.rows; ++r)
    if (std::memcmp(a.row_blocks(r), b.row_blocks(r), size_t(a.row_bytes())) != 0) return false;
  return true;
}

}  // namespace

const TernaryMatrix* ternary_of(const Model& m, Role role, int64_t layer) {
  const LayerWeights* L = layer >= 0 ? &m.layers[size_t(layer)] : nullptr;
  switch (role) {
    case Role::TokenEmbd: return &m.embed;
    case Role::Output: return &m.head;
    case Role::FfnGate: return &L->gate;
    case Role::FfnUp: return &L->up;
    case Role::FfnDown: return &L->down;
    case Role::AttnQ: return &L->attn.q;
    case Role::AttnK: return &L->attn.k;
    case Role::AttnV: return &L->attn.v;
    case Role::AttnOutput: return &L->attn.o;
    case Role::GdnQkv: return &L->gdn.qkv;
    case Role::GdnGate: return &L->gdn.z;
    case Role::GdnOut: return &L->gdn.out;
    default: return nullptr;
  }
}

const std::vector<float>& floats_of(const Model& m, Role role, int64_t layer) {
  const LayerWeights* L = layer >= 0 ? &m.layers[size_t(layer)] : nullptr;
  switch (role) {
    case Role::OutputNorm: return m.out_norm;
    case Role::AttnNorm: return L->attn_norm;
    case Role::PostAttnNorm: return L->post_norm;
    case Role::AttnQNorm: return L->attn.q_norm;
    case Role::AttnKNorm: return L->attn.k_norm;
    case Role::GdnAlpha: return L->gdn.a;
    case Role::GdnBeta: return L->gdn.b;
    case Role::GdnA: return L->gdn.A;
    case Role::GdnDtBias: return L->gdn.dt_bias;
    case Role::GdnConv: return L->gdn.conv;
    case Role::GdnNorm: return L->gdn.norm;
    default: fail("internal: tensor role {} holds ternary data, not floats", role_name(role));
  }
}

bool canonical_equal(const Model& a, const Model& b, std::string* diff) {
  auto report = [&](const std::string& what) {
    if (diff) *diff = what;
    return false;
  };
  if (a.layers.size() != b.layers.size()) return report("layer count");
  if (a.hadamard.enabled != b.hadamard.enabled || a.hadamard.block != b.hadamard.block ||
      a.hadamard.widths != b.hadamard.widths || a.hadamard.signs != b.hadamard.signs)
    return report("hadamard rotation");
  if (!same_ternary(a.embed, b.embed) || a.embed_inverse != b.embed_inverse) return report("token_embd");
  if (!same_ternary(a.head, b.head)) return report("output");
  if (!same(a.out_norm, b.out_norm)) return report("output_norm");
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights &x = a.layers[i], &y = b.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    if (x.full_attention != y.full_attention) return report(p + "kind");
    if (!same(x.attn_norm, y.attn_norm)) return report(p + "attn_norm");
    if (!same(x.post_norm, y.post_norm)) return report(p + "post_attention_norm");
    if (!same_ternary(x.gate, y.gate)) return report(p + "ffn_gate");
    if (!same_ternary(x.up, y.up)) return report(p + "ffn_up");
    if (!same_ternary(x.down, y.down)) return report(p + "ffn_down");
    if (!same_ternary(x.attn.q, y.attn.q)) return report(p + "attn_q");
    if (!same_ternary(x.attn.k, y.attn.k)) return report(p + "attn_k");
    if (!same_ternary(x.attn.v, y.attn.v)) return report(p + "attn_v");
    if (!same_ternary(x.attn.o, y.attn.o)) return report(p + "attn_output");
    if (!same(x.attn.q_norm, y.attn.q_norm)) return report(p + "attn_q_norm");
    if (!same(x.attn.k_norm, y.attn.k_norm)) return report(p + "attn_k_norm");
    if (!same_ternary(x.gdn.qkv, y.gdn.qkv)) return report(p + "attn_qkv");
    if (!same_ternary(x.gdn.z, y.gdn.z)) return report(p + "attn_gate");
    if (!same_ternary(x.gdn.out, y.gdn.out)) return report(p + "ssm_out");
    if (!same(x.gdn.a, y.gdn.a)) return report(p + "ssm_alpha");
    if (!same(x.gdn.b, y.gdn.b)) return report(p + "ssm_beta");
    if (!same(x.gdn.A, y.gdn.A)) return report(p + "ssm_a");
    if (!same(x.gdn.dt_bias, y.gdn.dt_bias)) return report(p + "ssm_dt.bias");
    if (!same(x.gdn.conv, y.gdn.conv)) return report(p + "ssm_conv1d");
    if (!same(x.gdn.norm, y.gdn.norm)) return report(p + "ssm_norm");
  }
  return true;
}

}  // namespace bonsai
