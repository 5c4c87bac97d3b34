// RunCommand: runs a shell command (kvcachectl, a script) for an integration
// test and captures its exit code and output.
#ifndef KVCACHE_TESTS_INTEGRATION_RUN_COMMAND_H_
#define KVCACHE_TESTS_INTEGRATION_RUN_COMMAND_H_

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvcache::testing {

struct CommandResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr
};

// Runs `command` with /bin/sh, feeding `stdin_text` (single-quoted: no ')
// when given.
inline CommandResult RunCommand(const std::string& command, const std::string& stdin_text = "") {
  const std::string full =
      stdin_text.empty() ? command + " 2>&1"
                         : absl::StrCat("printf '%s' '", stdin_text, "' | ", command, " 2>&1");
  CommandResult r;
  std::FILE* pipe = ::popen(full.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_RUN_COMMAND_H_
