#include "model/hadamard_contract.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "format/gguf.h"
#include "util/error.h"

namespace bonsai {

const int8_t* HadamardContract::signs_for(int64_t K, const std::string& what) const {
  if (sign_mode != "explicit") return nullptr;
  auto it = signs.find(K);
  if (it == signs.end()) fail("{}: no prism.hadamard sign vector of width {} (sign_widths has {})", what, K, fmt::join(sign_widths, ", "));
  return it->second.data();
}

namespace {

// The rules shared by both sources, applied once the raw values are read. `src` prefixes messages,
// `key` turns a field name into the name the user sees ("prism.hadamard.block_size" or "hadamard.json: block_size").
void check_rules(HadamardContract& h, const std::vector<double>& sign_values, const std::string& src,
                 const std::function<std::string(const char*)>& key, std::vector<std::string>& problems) {
  auto bad = [&](const std::string& msg) { problems.push_back(fmt::format("{}: {}", src, msg)); };
  if (h.version != 1) bad(fmt::format("{} is {}, expected 1", key("version"), h.version));
  if (h.block_size == 0 || (h.block_size & (h.block_size - 1)) != 0)
    bad(fmt::format("{} is {}, expected a non-zero power of two", key("block_size"), h.block_size));
  if (h.transform != kHadamardTransform)
    bad(fmt::format("{} is '{}', expected '{}'", key("transform"), h.transform, kHadamardTransform));
  if (h.axis != kHadamardAxis) bad(fmt::format("{} is '{}', expected '{}'", key("axis"), h.axis, kHadamardAxis));
  if (h.sign_mode != "identity" && h.sign_mode != "explicit")
    bad(fmt::format("{} is '{}', expected 'identity' or 'explicit'", key("sign_mode"), h.sign_mode));
  if (h.weight_names.empty()) bad(fmt::format("{} is empty, expected the folded matrices", key("weight_names")));
  std::set<std::string> seen;
  for (const auto& n : h.weight_names)
    if (!seen.insert(n).second) bad(fmt::format("{} lists '{}' twice", key("weight_names"), n));
  for (const auto& n : h.inverse_weight_names)
    if (seen.count(n)) bad(fmt::format("'{}' is in both {} and {}", n, key("weight_names"), key("inverse_weight_names")));
  if (h.sign_mode == "explicit") {
    int64_t total = 0;
    std::set<int64_t> widths;
    for (int64_t w : h.sign_widths) {
      if (w <= 0 || (h.block_size && w % h.block_size != 0))
        bad(fmt::format("{} has {}, expected a positive multiple of block_size {}", key("sign_widths"), w, h.block_size));
      if (!widths.insert(w).second) bad(fmt::format("{} lists width {} twice", key("sign_widths"), w));
      total += std::max<int64_t>(w, 0);
    }
    if (h.sign_widths.empty()) bad(fmt::format("{} is empty in explicit sign_mode", key("sign_widths")));
    if (int64_t(sign_values.size()) != total) {
      bad(fmt::format("{} has {} entries, expected {} (the sum of sign_widths)", key("sign_values"), sign_values.size(), total));
    } else {
      size_t at = 0;
      bool values_ok = true;
      for (int64_t w : h.sign_widths) {
        std::vector<int8_t> v(static_cast<size_t>(std::max<int64_t>(w, 0)));
        for (auto& s : v) {
          const double x = sign_values[at];
          if (x != 1.0 && x != -1.0) {
            if (values_ok) bad(fmt::format("{}[{}] is {}, expected +1 or -1", key("sign_values"), at, x));
            values_ok = false;
          }
          s = x < 0 ? -1 : 1;
          ++at;
        }
        if (w > 0) h.signs[w] = std::move(v);
      }
    }
  }
}

}  // namespace

HadamardContract hadamard_from_gguf(const GgufFile& f, std::vector<std::string>& problems) {
  HadamardContract h;
  const std::string p = "prism.hadamard.";
  bool any = false;
  for (const auto& k : f.keys()) any |= k.rfind(p, 0) == 0;
  if (!any) return h;
  h.present = true;
  auto key = [&](const char* k) { return p + k; };
  auto guard = [&](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  };
  guard([&] { h.version = f.get_u32(p + "version"); });
  guard([&] { h.block_size = f.get_u32(p + "block_size"); });
  guard([&] { h.transform = f.get_str(p + "transform"); });
  guard([&] { h.axis = f.get_str(p + "axis"); });
  guard([&] { h.sign_mode = f.get_str(p + "sign_mode"); });
  guard([&] { h.weight_names = f.get_arr_str(p + "weight_names"); });
  guard([&] { if (f.has(p + "inverse_weight_names")) h.inverse_weight_names = f.get_arr_str(p + "inverse_weight_names"); });
  std::vector<double> values;
  if (h.sign_mode == "explicit") {
    guard([&] { h.sign_widths = f.get_arr_int(p + "sign_widths"); });
    guard([&] { values = f.get_arr_num(p + "sign_values"); });
  }
  guard([&] {
    if (auto g = f.opt_bool(p + "gdn_v_grouped")) { h.has_gdn_v_grouped = true; h.gdn_v_grouped = *g; }
  });
  check_rules(h, values, f.path(), key, problems);
  return h;
}

HadamardContract hadamard_from_json(const nlohmann::json& j, const std::string& src, std::vector<std::string>& problems) {
  HadamardContract h;
  h.present = true;
  auto key = [&](const char* k) { return std::string(k); };
  auto bad = [&](const std::string& msg) { problems.push_back(fmt::format("{}: {}", src, msg)); };
  if (!j.is_object()) {
    bad("expected a JSON object");
    return h;
  }
  auto str = [&](const char* k, std::string& out) {
    if (!j.contains(k)) return bad(fmt::format("key '{}' is missing", k));
    if (!j[k].is_string()) return bad(fmt::format("key '{}' is {}, expected a string", k, j[k].type_name()));
    out = j[k].get<std::string>();
  };
  auto uint = [&](const char* k, uint32_t& out) {
    if (!j.contains(k)) return bad(fmt::format("key '{}' is missing", k));
    if (!j[k].is_number_integer() || j[k].get<int64_t>() < 0 || j[k].get<int64_t>() > 0xffffffffLL)
      return bad(fmt::format("key '{}' is {}, expected a non-negative integer", k, j[k].dump()));
    out = j[k].get<uint32_t>();
  };
  auto strs = [&](const char* k, std::vector<std::string>& out, bool required) {
    if (!j.contains(k)) {
      if (required) bad(fmt::format("key '{}' is missing", k));
      return;
    }
    if (!j[k].is_array()) return bad(fmt::format("key '{}' is {}, expected an array of strings", k, j[k].type_name()));
    for (const auto& v : j[k]) {
      if (!v.is_string()) return bad(fmt::format("key '{}' holds {}, expected strings", k, v.dump()));
      out.push_back(v.get<std::string>());
    }
  };
  uint("version", h.version);
  uint("block_size", h.block_size);
  str("transform", h.transform);
  str("axis", h.axis);
  str("sign_mode", h.sign_mode);
  strs("weight_names", h.weight_names, true);
  strs("inverse_weight_names", h.inverse_weight_names, false);
  std::vector<double> values;
  if (h.sign_mode == "explicit") {
    if (!j.contains("sign_widths") || !j["sign_widths"].is_array()) bad("key 'sign_widths' is missing or not an array");
    else
      for (const auto& v : j["sign_widths"]) {
        if (!v.is_number_integer()) { bad(fmt::format("key 'sign_widths' holds {}, expected integers", v.dump())); break; }
        h.sign_widths.push_back(v.get<int64_t>());
      }
    if (!j.contains("sign_values") || !j["sign_values"].is_array()) bad("key 'sign_values' is missing or not an array");
    else
      for (const auto& v : j["sign_values"]) {
        if (!v.is_number()) { bad(fmt::format("key 'sign_values' holds {}, expected numbers", v.dump())); break; }
        values.push_back(v.get<double>());
      }
  }
  if (j.contains("gdn_v_grouped")) {
    if (!j["gdn_v_grouped"].is_boolean()) bad(fmt::format("key 'gdn_v_grouped' is {}, expected a boolean", j["gdn_v_grouped"].dump()));
    else { h.has_gdn_v_grouped = true; h.gdn_v_grouped = j["gdn_v_grouped"].get<bool>(); }
  }
  check_rules(h, values, src, key, problems);
  return h;
}

void hadamard_to_gguf(const HadamardContract& h, GgufWriter& w) {
  const std::string p = "prism.hadamard.";
  w.set(p + "version", GgufValue::u32(h.version));
  w.set(p + "block_size", GgufValue::u32(h.block_size));
  w.set(p + "transform", GgufValue::str(h.transform));
  w.set(p + "axis", GgufValue::str(h.axis));
  w.set(p + "sign_mode", GgufValue::str(h.sign_mode));
  w.set(p + "weight_names", GgufValue::arr_str(h.weight_names));
  if (!h.inverse_weight_names.empty()) w.set(p + "inverse_weight_names", GgufValue::arr_str(h.inverse_weight_names));
  if (h.sign_mode == "explicit") {
    std::vector<int32_t> widths, values;
    for (int64_t wd : h.sign_widths) {
      widths.push_back(int32_t(wd));
      for (int8_t s : h.signs.at(wd)) values.push_back(s);
    }
    w.set(p + "sign_widths", GgufValue::arr_i32(widths));
    w.set(p + "sign_values", GgufValue::arr_i32(values));
  }
  if (h.has_gdn_v_grouped) w.set(p + "gdn_v_grouped", GgufValue::boolean(h.gdn_v_grouped));
}

nlohmann::json hadamard_to_json(const HadamardContract& h) {
  nlohmann::ordered_json j;
  j["version"] = h.version;
  j["block_size"] = h.block_size;
  j["transform"] = h.transform;
  j["axis"] = h.axis;
  j["sign_mode"] = h.sign_mode;
  j["weight_names"] = h.weight_names;
  if (!h.inverse_weight_names.empty()) j["inverse_weight_names"] = h.inverse_weight_names;
  if (h.sign_mode == "explicit") {
    j["sign_widths"] = h.sign_widths;
    std::vector<double> values;
    for (int64_t wd : h.sign_widths)
      for (int8_t s : h.signs.at(wd)) values.push_back(double(s));
    j["sign_values"] = values;
  }
  if (h.has_gdn_v_grouped) j["gdn_v_grouped"] = h.gdn_v_grouped;
  return nlohmann::json::parse(j.dump());
}

}  // namespace bonsai
