// A small reader over a fuzz input, for targets that turn bytes into a sequence of choices rather
// than parse them as a file format. Past the end every read returns its lowest value, so any prefix
// of an input is a valid input and libFuzzer can shrink freely. (LLVM's FuzzedDataProvider does the
// same but ships only with clang; the replay build also compiles with GCC.)
#ifndef LAZYATTN_TESTS_FUZZ_FUZZ_INPUT_H_
#define LAZYATTN_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace lazyattn::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool Bool() { return (Byte() & 1) != 0; }
  // Uniform enough in [lo, hi] (inclusive) for hi - lo < 65536; two bytes at most.
  uint32_t Range(uint32_t lo, uint32_t hi) {
    const uint32_t span = hi - lo + 1;
    uint32_t v = Byte();
    if (span > 256) v = (v << 8) | Byte();
    return lo + v % span;
  }
  // `n` bytes (fewer when the input runs out).
  std::string Bytes(size_t n) {
    std::string s;
    while (n-- > 0 && !empty()) s.push_back(static_cast<char>(Byte()));
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace lazyattn::fuzz

#endif  // LAZYATTN_TESTS_FUZZ_FUZZ_INPUT_H_
