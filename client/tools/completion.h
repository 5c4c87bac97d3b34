// Shell completion for kvcachectl, generated from its CLI11 app: walking the
// app's subcommands, options and their validators, so that a new subcommand
// or option completes the day it is added (nothing here lists them).
//
//   source <(kvcachectl completion bash)    # in ~/.bashrc
//   source <(kvcachectl completion zsh)     # in ~/.zshrc (through bashcompinit)
//
// The script completes subcommands, the global options and the options of the
// subcommand on the line, the values of options checked against a set
// (CLI::IsMember: --data-path, --mode, ...) and of positionals with such a
// set (checkpoint list|verify|now), and file names for options named *-file.
#ifndef KVCACHE_CLIENT_TOOLS_COMPLETION_H_
#define KVCACHE_CLIENT_TOOLS_COMPLETION_H_

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kvcache::ctl {

// A bash script defining the completion function of `app.get_name()` and
// registering it with `complete -F`.
std::string BashCompletion(const CLI::App& app);
// The bash script behind zsh's bashcompinit.
std::string ZshCompletion(const CLI::App& app);

// The choices an option's validators allow ("{a,b,c}" in its type name), or
// none. For tests.
std::vector<std::string> OptionChoices(const CLI::Option& option);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CLIENT_TOOLS_COMPLETION_H_
