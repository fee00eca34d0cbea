#include "tokenizer/hf_tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/pretokenizer.h"
#include "util/error.h"

namespace bonsai {
namespace {

using json = nlohmann::json;

json read_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("{}: cannot create", tmp);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f) fail("{}: write failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename from {}: {}", path, tmp, ec.message());
}

// The Split regex of an HF pre_tokenizer (a Split, or a Sequence holding one), or "" when there is none.
std::string find_split_regex(const json& pt, std::string_view what) {
  if (!pt.is_object()) return {};
  const std::string type = pt.value("type", "");
  if (type == "Split") {
    const auto& pat = pt.at("pattern");
    if (pat.contains("Regex")) return pat.at("Regex").get<std::string>();
    fail("{}: pre_tokenizer Split uses a plain string pattern, not a regex (not supported)", what);
  }
  if (type == "Sequence") {
    std::string found;
    for (const auto& p : pt.at("pretokenizers")) {
      std::string r = find_split_regex(p, what);
      if (!r.empty()) {
        if (!found.empty()) fail("{}: pre_tokenizer has more than one Split regex (not supported)", what);
        found = std::move(r);
      }
    }
    return found;
  }
  return {};
}

std::optional<int32_t> token_ref(const Vocabulary& v, const json& ref, std::string_view what, const char* key) {
  if (ref.is_null()) return std::nullopt;
  std::string text;
  if (ref.is_string()) text = ref.get<std::string>();
  else if (ref.is_object() && ref.contains("content")) text = ref.at("content").get<std::string>();
  else fail("{}: {} must be a string or {{\"content\": ...}}", what, key);
  const auto id = v.find(text);
  if (!id) fail("{}: {} '{}' is not a token of the vocabulary", what, key, text);
  return id;
}

}  // namespace

Vocabulary vocabulary_from_tokenizer_json(const json& j, std::string_view what) {
  try {
    const json& model = j.at("model");
    const std::string mtype = model.value("type", "BPE");
    if (mtype != "BPE") fail("{}: model.type is '{}', expected 'BPE'", what, mtype);
    if (model.value("byte_fallback", false)) fail("{}: BPE byte_fallback=true is not supported", what);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && model.at(key).is_string() && !model.at(key).get<std::string>().empty())
        fail("{}: BPE {} is not supported", what, key);

    Vocabulary v;
    v.ignore_merges = model.value("ignore_merges", false);
    std::map<int64_t, std::pair<std::string, int32_t>> rows;  // id -> (text, type)
    for (const auto& [tok, idj] : model.at("vocab").items()) {
      const int64_t id = idj.get<int64_t>();
      if (id < 0 || id > INT32_MAX) fail("{}: model.vocab['{}'] = {} is not a valid id", what, tok, id);
      if (!rows.emplace(id, std::make_pair(tok, static_cast<int32_t>(TokenType::Normal))).second)
        fail("{}: model.vocab gives id {} twice", what, id);
    }
    if (j.contains("added_tokens") && j.at("added_tokens").is_array()) {
      for (const auto& at : j.at("added_tokens")) {
        const int64_t id = at.at("id").get<int64_t>();
        const std::string content = at.at("content").get<std::string>();
        if (id < 0 || id > INT32_MAX) fail("{}: added token '{}' has invalid id {}", what, content, id);
        for (const char* flag : {"lstrip", "rstrip", "single_word"})
          if (at.value(flag, false))
            fail("{}: added token '{}' (id {}) sets {}=true, which is not supported", what, content, id, flag);
        const auto type = at.value("special", false) ? TokenType::Control : TokenType::UserDefined;
        rows[id] = {content, static_cast<int32_t>(type)};  // an added token overrides a vocab entry
      }
    }
    if (rows.empty()) fail("{}: model.vocab is empty", what);
    const auto n = static_cast<size_t>(rows.rbegin()->first + 1);
    v.tokens.resize(n);
    v.token_types.assign(n, static_cast<int32_t>(TokenType::Unused));
    for (size_t i = 0; i < n; ++i) v.tokens[i] = "[PAD" + std::to_string(i) + "]";
    for (auto& [id, row] : rows) {
      v.tokens[static_cast<size_t>(id)] = std::move(row.first);
      v.token_types[static_cast<size_t>(id)] = row.second;
    }

    const json& merges = model.at("merges");
    v.merges.reserve(merges.size());
    for (const auto& mg : merges) {
      if (mg.is_string()) {
        v.merges.push_back(mg.get<std::string>());
      } else if (mg.is_array() && mg.size() == 2) {
        v.merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
      } else {
        fail("{}: model.merges[{}] is neither \"a b\" nor [a, b]", what, v.merges.size());
      }
    }

    if (j.contains("normalizer") && !j.at("normalizer").is_null()) {
      const std::string nt = j.at("normalizer").value("type", "");
      if (nt != "NFC") fail("{}: normalizer '{}' is not supported (expected NFC)", what, nt);
    }
    const std::string regex = find_split_regex(j.value("pre_tokenizer", json()), what);
    if (regex.empty())
      fail("{}: pre_tokenizer has no Split regex; known pre-tokenizers: {}", what, known_pretokenizer_names());
    v.pre = pretokenizer_name_for_regex(regex);
    if (v.pre.empty())
      fail("{}: pre_tokenizer regex '{}' is not one of the known pre-tokenizers ({})", what, regex,
           known_pretokenizer_names());
    // Conventional defaults before tokenizer_config.json says otherwise: Qwen's eos is <|im_end|>.
    if (auto id = v.find("<|im_end|>"); id && v.is_added(*id)) v.eos_id = *id;
    else if (auto id2 = v.find("<|endoftext|>"); id2 && v.is_added(*id2)) v.eos_id = *id2;
    if (auto id = v.find("<|endoftext|>"); id && v.is_added(*id)) v.pad_id = *id;
    v.validate(what);
    return v;
  } catch (const json::exception& e) {
    fail("{}: malformed tokenizer.json: {}", what, e.what());
  }
}

Vocabulary vocabulary_from_tokenizer_json_text(std::string_view text, std::string_view what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", what, e.what());
  }
  return vocabulary_from_tokenizer_json(j, what);
}

Vocabulary vocabulary_from_tokenizer_json(const std::string& path) {
  return vocabulary_from_tokenizer_json(read_json_file(path), path);
}

void apply_tokenizer_config(Vocabulary& v, const json& c, std::string_view what) {
  try {
    if (c.contains("eos_token")) {
      if (auto id = token_ref(v, c.at("eos_token"), what, "eos_token")) v.eos_id = *id;
    }
    if (c.contains("pad_token")) v.pad_id = token_ref(v, c.at("pad_token"), what, "pad_token");
    if (c.contains("bos_token")) v.bos_id = token_ref(v, c.at("bos_token"), what, "bos_token");
    if (c.contains("add_bos_token") && c.at("add_bos_token").is_boolean()) v.add_bos = c.at("add_bos_token").get<bool>();
  } catch (const json::exception& e) {
    fail("{}: malformed tokenizer_config.json: {}", what, e.what());
  }
}

Vocabulary vocabulary_from_hf_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d(dir);
  Vocabulary v = vocabulary_from_tokenizer_json((d / "tokenizer.json").string());
  const auto cfg = d / "tokenizer_config.json";
  if (fs::exists(cfg)) apply_tokenizer_config(v, read_json_file(cfg.string()), cfg.string());
  const auto gen = d / "generation_config.json";
  if (fs::exists(gen)) {
    const json g = read_json_file(gen.string());
    if (g.contains("eos_token_id")) {
      const json& e = g.at("eos_token_id");
      std::vector<int64_t> ids;
      if (e.is_number_integer()) ids.push_back(e.get<int64_t>());
      else if (e.is_array())
        for (const auto& x : e) ids.push_back(x.get<int64_t>());
      for (int64_t id : ids) {
        if (id < 0 || id >= static_cast<int64_t>(v.size()))
          fail("{}: eos_token_id {} is outside the vocabulary (size {})", gen.string(), id, v.size());
        v.extra_eos_ids.push_back(static_cast<int32_t>(id));
      }
    }
  }
  v.validate(dir);
  return v;
}

json tokenizer_json(const Vocabulary& v) {
  v.validate("write_tokenizer_json");
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const auto type = static_cast<TokenType>(v.token_types[i]);
    if (type == TokenType::Unused) continue;
    if (type == TokenType::Control || type == TokenType::UserDefined) {
      added.push_back({{"id", i}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", type == TokenType::Control}});
    } else {
      vocab[v.tokens[i]] = i;
    }
  }
  json merges = json::array();
  for (const auto& m : v.merges) {
    const auto sp = m.find(' ');
    merges.push_back(json::array({m.substr(0, sp), m.substr(sp + 1)}));
  }
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         json::array({json{{"type", "Split"},
                                           {"pattern", {{"Regex", pretokenizer_hf_regex(v.pre)}}},
                                           {"behavior", "Isolated"},
                                           {"invert", false}},
                                      byte_level})}};
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", v.ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  return j;
}

void write_tokenizer_json(const Vocabulary& v, const std::string& path) {
  write_text_file(path, tokenizer_json(v).dump(1, ' ', false, json::error_handler_t::strict) + "\n");
}

json tokenizer_config_json(const Vocabulary& v, const std::string& chat_template) {
  json added = json::object();
  for (size_t i = 0; i < v.size(); ++i) {
    const auto type = static_cast<TokenType>(v.token_types[i]);
    if (type != TokenType::Control && type != TokenType::UserDefined) continue;
    added[std::to_string(i)] = {{"content", v.tokens[i]}, {"lstrip", false}, {"normalized", false},
                                {"rstrip", false}, {"single_word", false}, {"special", type == TokenType::Control}};
  }
  auto tok_or_null = [&](std::optional<int32_t> id) -> json {
    if (!id || *id < 0) return nullptr;
    return v.tokens[static_cast<size_t>(*id)];
  };
  json c;
  c["add_bos_token"] = v.add_bos;
  c["add_prefix_space"] = false;
  c["added_tokens_decoder"] = std::move(added);
  c["bos_token"] = tok_or_null(v.bos_id);
  if (!chat_template.empty()) c["chat_template"] = chat_template;
  c["clean_up_tokenization_spaces"] = false;
  c["eos_token"] = tok_or_null(v.eos_id >= 0 ? std::optional<int32_t>(v.eos_id) : std::nullopt);
  c["errors"] = "replace";
  c["model_max_length"] = 262144;
  c["pad_token"] = tok_or_null(v.pad_id);
  c["split_special_tokens"] = false;
  c["tokenizer_class"] = "Qwen2Tokenizer";
  c["unk_token"] = nullptr;
  return c;
}

void write_tokenizer_config_json(const Vocabulary& v, const std::string& path, const std::string& chat_template) {
  write_text_file(path, tokenizer_config_json(v, chat_template).dump(2, ' ', false, json::error_handler_t::strict) + "\n");
}

}  // namespace bonsai
