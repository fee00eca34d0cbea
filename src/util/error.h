// bonsai::Error: every load and user error is thrown as this, with context (file, tensor, key,
// expected vs found) in the message, and caught once at the CLI / server boundary.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace bonsai {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// fail("{}: tensor '{}' has shape {}, expected {}", path, name, got, want);
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace bonsai
