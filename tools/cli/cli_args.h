// A small command-line parser for the `lazyattn` tool: `lazyattn COMMAND --flag value --switch`.
// Every flag is declared with its kind; an unknown flag, a missing or malformed value is an error
// that names the flag.
#ifndef LAZYATTN_TOOLS_CLI_CLI_ARGS_H_
#define LAZYATTN_TOOLS_CLI_CLI_ARGS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyattn {

class CliArgs {
 public:
  enum class Kind { kSwitch, kValue, kRepeated };
  // Declares a flag (without the leading dashes) with its help line.
  void Declare(const std::string& name, Kind kind, const std::string& help);
  // Parses argv[first..argc).
  absl::Status Parse(int argc, char** argv, int first);
  std::string Help() const;

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string String(const std::string& name, const std::string& fallback = "") const;
  std::vector<std::string> Strings(const std::string& name) const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;

 private:
  struct Spec {
    Kind kind;
    std::string help;
  };
  std::map<std::string, Spec> specs_;
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_TOOLS_CLI_CLI_ARGS_H_
