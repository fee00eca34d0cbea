// libFuzzer target: GgufFile on arbitrary bytes. A malformed input must end in bonsai::Error; anything
// else (a crash, a sanitizer report, another exception type, a hang) is a bug. An accepted input must
// also be accepted by the writer: what we can read, we can write back.
#include <cstddef>
#include <cstdint>

#include "format/gguf.h"
#include "util/error.h"

using namespace bonsai;

namespace {

// Calls a getter that may legitimately refuse the value (wrong type, out of range).
template <typename F>
void try_get(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> file;
  try {
    file = std::make_unique<GgufFile>(data, size, "fuzz.gguf");
  } catch (const Error&) {
    return 0;
  }

  // Every tensor's bytes must lie inside the input: touch the first and last byte (ASan checks).
  volatile uint8_t sink = 0;
  for (const auto& t : file->tensors()) {
    if (t.nbytes) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    if (file->find_tensor(t.name) != &t) __builtin_trap();
  }
  for (const auto& key : file->keys()) {
    if (!file->find(key)) __builtin_trap();
    try_get([&] { file->get_u32(key); });
    try_get([&] { file->get_u64(key); });
    try_get([&] { file->get_i64(key); });
    try_get([&] { file->get_f32(key); });
    try_get([&] { file->get_bool(key); });
    try_get([&] { file->get_str(key); });
    try_get([&] { file->get_arr_str(key); });
    try_get([&] { file->get_arr_int(key); });
    try_get([&] { file->get_arr_num(key); });
  }

  // Not caught: the writer refusing what the reader accepted is a bug.
  GgufWriter w;
  for (const auto& key : file->keys()) w.set(key, *file->find(key));
  for (const auto& t : file->tensors())
    w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  if (w.total_bytes() == 0) __builtin_trap();
  return 0;
}
