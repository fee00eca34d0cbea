// Streaming text filters of a chat reply, applied to the decoded text as it arrives (StreamingDecoder
// output, always whole UTF-8 characters):
//
//   StopStrings: ends the reply at the first occurrence of any --stop string. Text that could still be the
//     beginning of a stop string is held back, so nothing is ever shown and then taken back.
//   ReasoningSplitter: separates the reasoning between <think> and </think> from the answer. The tags are
//     removed, each part is trimmed of leading and trailing whitespace (streaming: trailing whitespace is
//     held until more text of the same part follows), and a tag split across pushes is still found.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace bonsai {

class StopStrings {
 public:
  // Throws bonsai::Error for an empty stop string.
  explicit StopStrings(std::vector<std::string> stops = {});
  bool empty() const { return stops_.empty(); }

  // Appends to `out` the part of `text` that can be shown now. Returns true when a stop string completed:
  // `out` then ends right before it and everything from it on is dropped (later pushes are ignored).
  bool push(std::string_view text, std::string& out);
  // The held-back text (no stop string completed), appended to `out`.
  void flush(std::string& out);
  bool hit() const { return hit_; }
  void reset();

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a suffix of the text so far that is a proper prefix of some stop string
  bool hit_ = false;
};

enum class ReplyPart { Reasoning, Answer };

struct ReplyPiece {
  ReplyPart part;
  std::string text;
};

class ReasoningSplitter {
 public:
  static constexpr std::string_view kOpen = "<think>";
  static constexpr std::string_view kClose = "</think>";

  // in_reasoning: the prompt already opened a think block (Qwen3.5's generation prompt ends "<think>\n").
  explicit ReasoningSplitter(bool in_reasoning = false) { start(in_reasoning); }
  void start(bool in_reasoning);

  // Appends the pieces `text` completes (consecutive text of one part is one piece).
  void push(std::string_view text, std::vector<ReplyPiece>& out);
  // End of the reply: whatever is held back that belongs to the output (a partial tag is text).
  void finish(std::vector<ReplyPiece>& out);
  ReplyPart part() const { return in_reasoning_ ? ReplyPart::Reasoning : ReplyPart::Answer; }

  // Whether the text of a prompt leaves a think block open (its last <think> comes after its last </think>).
  static bool opens_reasoning(std::string_view prompt);

 private:
  void emit(std::string_view text, std::vector<ReplyPiece>& out);
  void end_part();

  bool in_reasoning_ = false;
  std::string pending_;  // text not yet scanned past: a possible partial tag at its end
  bool started_ = false;  // the current part has shown non-whitespace text
  std::string ws_;        // trailing whitespace of the current part, held back
};

}  // namespace bonsai
