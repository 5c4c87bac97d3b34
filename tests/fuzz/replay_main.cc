// A main() for kvcached's fuzz targets without libFuzzer: calls
// LLVMFuzzerTestOneInput once with every file under the folders (or files)
// named on the command line, so the ordinary build and the sanitizer pass
// replay the saved corpus and every crash reproducer (tests/fuzz/README.md).
// Files whose names start with '.' are skipped. Exits 1 when it found no
// input at all (a replay of nothing proves nothing); a failing input aborts.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"

namespace {

bool ReadFile(const std::filesystem::path& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_regular_file(arg, ec)) {
      files.push_back(arg);
      continue;
    }
    if (!std::filesystem::is_directory(arg, ec)) {
      std::fprintf(stderr, "replay: %s is neither a file nor a folder\n", argv[i]);
      return 1;
    }
    for (const auto& entry : std::filesystem::recursive_directory_iterator(arg)) {
      if (entry.is_regular_file() && entry.path().filename().string().rfind('.', 0) != 0) {
        files.push_back(entry.path());
      }
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<uint8_t> bytes;
  for (const auto& file : files) {
    if (!ReadFile(file, &bytes)) {
      std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
      return 1;
    }
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
    // A copy of exactly the input's size, so ASan sees a read past its end.
    std::vector<uint8_t> input(bytes);
    LLVMFuzzerTestOneInput(input.empty() ? nullptr : input.data(), input.size());
  }
  if (files.empty()) {
    std::fprintf(stderr, "replay: no input files\n");
    return 1;
  }
  std::printf("replay: %zu inputs, none failed\n", files.size());
  return 0;
}
