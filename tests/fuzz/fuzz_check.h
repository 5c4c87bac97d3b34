// Helpers shared by kvcached's fuzz targets (tests/fuzz/README.md).
//
// FUZZ_CHECK states a property every input must keep (a decoder that accepts
// bytes must also decode them; a round trip must give the same value). It
// aborts with a message when the property fails, in every build type, so
// libFuzzer and the replay tests both report it as a crash.
#ifndef KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_
#define KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                    \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace kvcache::fuzz {

// Reads the input front to back: small values that steer a target, then the rest.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  // The next byte, or 0 once the input is used up.
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  const uint8_t* rest() const { return data_ + pos_; }
  size_t rest_size() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace kvcache::fuzz

#endif  // KVCACHE_TESTS_FUZZ_FUZZ_CHECK_H_
