#include "engine/gate.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "util/error.h"

namespace bonsai {

void GateStats::add(const GateStats& o) {
  positions += o.positions;
  counted += o.counted;
  agree += o.agree;
  max_delta = std::max(max_delta, o.max_delta);
  sum_kl += o.sum_kl;
}

GateFixture read_gate_fixture(const std::string& path) {
  SafetensorsFile f(path);
  GateFixture fx;
  fx.metadata = f.metadata();
  auto it = fx.metadata.find("prompts");
  if (it == fx.metadata.end()) fail("{}: gate fixture without the metadata key 'prompts'", path);
  int64_t n = 0;
  try {
    size_t used = 0;
    n = std::stoll(it->second, &used);
    if (used != it->second.size() || n < 1) throw std::invalid_argument("count");
  } catch (const std::exception&) {
    fail("{}: metadata 'prompts' = '{}' is not a positive count", path, it->second);
  }
  std::vector<std::string> names;
  if (auto nm = fx.metadata.find("names"); nm != fx.metadata.end()) {
    nlohmann::json j = nlohmann::json::parse(nm->second, nullptr, false);
    if (!j.is_array() || int64_t(j.size()) != n)
      fail("{}: metadata 'names' must be a JSON list of {} names, got '{}'", path, n, nm->second);
    for (const auto& e : j) {
      if (!e.is_string()) fail("{}: metadata 'names' holds a non-string entry", path);
      names.push_back(e.get<std::string>());
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    GatePrompt p;
    p.name = names.empty() ? "p" + std::to_string(i) : names[size_t(i)];
    const std::string tn = "p" + std::to_string(i) + ".tokens", ln = "p" + std::to_string(i) + ".logits";
    const StTensor* t = f.find(tn);
    const StTensor* l = f.find(ln);
    if (!t) fail("{}: tensor '{}' is missing ({} prompts declared)", path, tn, n);
    if (!l) fail("{}: tensor '{}' is missing ({} prompts declared)", path, ln, n);
    if (t->dtype != StDtype::I32 || t->shape.size() != 1 || t->shape[0] < 1)
      fail("{}: '{}' must be I32 [T] with T >= 1, got {} of rank {}", path, tn, st_dtype_name(t->dtype), t->shape.size());
    const uint64_t T = t->shape[0];
    if (l->dtype != StDtype::F32 || l->shape.size() != 2 || l->shape[0] != T || l->shape[1] < 2)
      fail("{}: '{}' must be F32 [{}, V] (V >= 2), got {} with shape of rank {}", path, ln, T, st_dtype_name(l->dtype),
           l->shape.size());
    const int64_t V = int64_t(l->shape[1]);
    if (fx.vocab == 0) fx.vocab = V;
    if (V != fx.vocab) fail("{}: '{}' has V = {}, earlier prompts have {}", path, ln, V, fx.vocab);
    p.tokens.resize(T);
    std::memcpy(p.tokens.data(), t->data, T * 4);
    p.logits.resize(T * uint64_t(V));
    std::memcpy(p.logits.data(), l->data, p.logits.size() * 4);
    fx.prompts.push_back(std::move(p));
  }
  return fx;
}

void write_gate_fixture(const std::string& path, const GateFixture& f) {
  SafetensorsWriter w;
  for (const auto& [k, v] : f.metadata) w.set_metadata(k, v);
  w.set_metadata("prompts", std::to_string(f.prompts.size()));
  nlohmann::json names = nlohmann::json::array();
  for (const GatePrompt& p : f.prompts) names.push_back(p.name);
  w.set_metadata("names", names.dump());
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    const GatePrompt& p = f.prompts[i];
    const uint64_t T = p.tokens.size();
    if (p.logits.size() != T * uint64_t(f.vocab)) fail("{}: prompt {} has {} logits for {} tokens of V = {}", path, i, p.logits.size(), T, f.vocab);
    std::vector<uint8_t> tb(T * 4), lb(p.logits.size() * 4);
    std::memcpy(tb.data(), p.tokens.data(), tb.size());
    std::memcpy(lb.data(), p.logits.data(), lb.size());
    w.add("p" + std::to_string(i) + ".tokens", StDtype::I32, {T}, std::move(tb));
    w.add("p" + std::to_string(i) + ".logits", StDtype::F32, {T, uint64_t(f.vocab)}, std::move(lb));
  }
  w.write(path);
}

void gate_compare(const float* ref, const float* ours, int64_t T, int64_t V, double tie_band, GateStats& s) {
  for (int64_t t = 0; t < T; ++t) {
    const float* r = ref + t * V;
    const float* o = ours + t * V;
    // Reference top-2 (lowest index first on ties) and our argmax.
    int64_t r1 = 0, o1 = 0;
    double best1 = -INFINITY, best2 = -INFINITY, obest = -INFINITY, rmax = -INFINITY, omax = -INFINITY;
    for (int64_t v = 0; v < V; ++v) {
      const double rv = r[v], ov = o[v];
      if (rv > best1) {
        best2 = best1;
        best1 = rv;
        r1 = v;
      } else if (rv > best2) {
        best2 = rv;
      }
      if (ov > obest) {
        obest = ov;
        o1 = v;
      }
      s.max_delta = std::max(s.max_delta, std::fabs(ov - rv));
      if (!std::isfinite(ov)) s.max_delta = INFINITY;
      rmax = std::max(rmax, rv);
      omax = std::max(omax, ov);
    }
    // KL(ref || ours) = sum p_ref (log p_ref - log p_ours), both log-softmax in double.
    double zr = 0, zo = 0;
    for (int64_t v = 0; v < V; ++v) {
      zr += std::exp(double(r[v]) - rmax);
      zo += std::exp(double(o[v]) - omax);
    }
    const double lzr = std::log(zr) + rmax, lzo = std::log(zo) + omax;
    double kl = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double lr = double(r[v]) - lzr, lo = double(o[v]) - lzo;
      kl += std::exp(lr) * (lr - lo);
    }
    if (!std::isfinite(kl)) kl = INFINITY;
    s.sum_kl += std::max(0.0, kl);
    ++s.positions;
    if (best1 - best2 >= tie_band) {
      ++s.counted;
      if (o1 == r1) ++s.agree;
    }
  }
}

GateReport run_gate(Decoder& decoder, const GateFixture& fx, const GateOptions& opt, const SessionOptions& session_opt) {
  if (fx.vocab != decoder.vocab())
    fail("the fixture's logits have V = {}, the pack's vocabulary has {} entries", fx.vocab, decoder.vocab());
  int64_t longest = 0;
  for (const GatePrompt& p : fx.prompts) longest = std::max<int64_t>(longest, int64_t(p.tokens.size()));
  SessionOptions so = session_opt;
  if (so.capacity == 0) so.capacity = longest;
  Session session(decoder, so);
  GateReport rep;
  rep.overall.name = "overall";
  std::vector<float> ours;
  for (const GatePrompt& p : fx.prompts) {
    const int64_t T = int64_t(p.tokens.size()), V = fx.vocab;
    session.reset();
    ours.assign(size_t(T * V), NAN);
    try {
      session.append_all(p.tokens, ours.data());
    } catch (const Error& e) {
      fail("gate prompt '{}': {}", p.name, e.what());
    }
    GateStats s;
    s.name = p.name;
    gate_compare(p.logits.data(), ours.data(), T, V, opt.tie_band, s);
    rep.overall.add(s);
    rep.prompts.push_back(std::move(s));
  }
  const GateStats& o = rep.overall;
  if (opt.min_agreement >= 1.0 ? o.agree < o.counted : !(o.agreement() >= opt.min_agreement))
    rep.failures.push_back(fmt::format("argmax agreement {}/{} counted positions ({:.2f}%) is below {}", o.agree,
                                       o.counted, 100.0 * o.agreement(),
                                       opt.min_agreement >= 1.0 ? std::string("100%")
                                                                : fmt::format("--min-agreement {:g}", opt.min_agreement)));
  if (!(o.max_delta <= opt.max_delta))
    rep.failures.push_back(fmt::format("max |delta logit| {:.4g} exceeds --max-delta {:.4g}", o.max_delta, opt.max_delta));
  if (!(o.mean_kl() <= opt.max_kl))
    rep.failures.push_back(fmt::format("mean KL {:.4g} exceeds --max-kl {:.4g}", o.mean_kl(), opt.max_kl));
  return rep;
}

}  // namespace bonsai
