// Unicode NFC normalisation (libutf8proc) with a fast path: text made only of "NFC-inert" code points
// (see normalize.cpp) is returned unchanged without calling utf8proc, which is the common case for
// ASCII, CJK, Cyrillic, ... text.
#pragma once
#include <string>
#include <string_view>

namespace bonsai {

// True when NFC(text) == text is guaranteed by the per-code-point table (input must be valid UTF-8).
bool nfc_quick_check(std::string_view text);

// NFC of valid UTF-8 text (throws bonsai::Error on utf8proc failure, which valid input never causes).
std::string nfc_normalize(std::string_view text);

// Like nfc_normalize but leaves `text` untouched and returns false when it is already NFC by the quick
// check; otherwise writes the normalised text to `out` and returns true.
bool nfc_normalize_if_needed(std::string_view text, std::string& out);

}  // namespace bonsai
