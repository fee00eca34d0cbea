#include "engine/chat_text.h"

#include <algorithm>

#include "util/error.h"

namespace bonsai {

namespace {

// Length of the longest suffix of `s` that is a proper prefix of `pat` (0 when none).
size_t partial_suffix(std::string_view s, std::string_view pat) {
  for (size_t k = std::min(s.size(), pat.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == pat.substr(0, k)) return k;
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

// ---- StopStrings -------------------------------------------------------------------------------------

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_)
    if (s.empty()) fail("--stop: a stop string must not be empty");
}

bool StopStrings::push(std::string_view text, std::string& out) {
  if (hit_) return true;
  if (stops_.empty()) {
    out += text;
    return false;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf += text;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, buf.find(s));
  if (first != std::string::npos) {
    out.append(buf, 0, first);
    hit_ = true;
    return true;
  }
  size_t keep = 0;
  for (const std::string& s : stops_) keep = std::max(keep, partial_suffix(buf, s));
  out.append(buf, 0, buf.size() - keep);
  held_ = buf.substr(buf.size() - keep);
  return false;
}

void StopStrings::flush(std::string& out) {
  if (!hit_) out += held_;
  held_.clear();
}

void StopStrings::reset() {
  held_.clear();
  hit_ = false;
}

// ---- ReasoningSplitter -------------------------------------------------------------------------------

void ReasoningSplitter::start(bool in_reasoning) {
  in_reasoning_ = in_reasoning;
  pending_.clear();
  started_ = false;
  ws_.clear();
}

bool ReasoningSplitter::opens_reasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kOpen), close = prompt.rfind(kClose);
  if (open == std::string_view::npos) return false;
  return close == std::string_view::npos || open > close;
}

void ReasoningSplitter::emit(std::string_view text, std::vector<ReplyPiece>& out) {
  if (!started_) {  // leading whitespace of a part is dropped
    size_t i = 0;
    while (i < text.size() && is_space(text[i])) ++i;
    text.remove_prefix(i);
    if (text.empty()) return;
    started_ = true;
  }
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  if (end == 0) {  // only whitespace: hold it until we know more text of this part follows
    ws_ += text;
    return;
  }
  const ReplyPart p = part();
  if (out.empty() || out.back().part != p) out.push_back({p, {}});
  out.back().text += ws_;
  out.back().text.append(text.substr(0, end));
  ws_.assign(text.substr(end));
}

void ReasoningSplitter::end_part() {
  started_ = false;
  ws_.clear();  // trailing whitespace of a part is dropped
}

void ReasoningSplitter::push(std::string_view text, std::vector<ReplyPiece>& out) {
  pending_ += text;
  for (;;) {
    // In the answer, <think> starts reasoning (a model may open the block itself, e.g. under ChatML); in
    // the reasoning, </think> ends it.
    const std::string_view tag = in_reasoning_ ? kClose : kOpen;
    const size_t at = pending_.find(tag);
    if (at == std::string::npos) break;
    emit(std::string_view(pending_).substr(0, at), out);
    end_part();
    in_reasoning_ = !in_reasoning_;
    pending_.erase(0, at + tag.size());
  }
  const size_t keep = partial_suffix(pending_, in_reasoning_ ? kClose : kOpen);
  emit(std::string_view(pending_).substr(0, pending_.size() - keep), out);
  pending_.erase(0, pending_.size() - keep);
}

void ReasoningSplitter::finish(std::vector<ReplyPiece>& out) {
  emit(pending_, out);
  pending_.clear();
  end_part();
}

}  // namespace bonsai
