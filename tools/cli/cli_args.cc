#include "tools/cli/cli_args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lazyattn {

void CliArgs::Declare(const std::string& name, Kind kind, const std::string& help) {
  specs_[name] = {kind, help};
}

absl::Status CliArgs::Parse(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (it->second.kind == Kind::kSwitch) {
      if (inline_value) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      }
      values_[name].push_back("true");
      continue;
    }
    if (!inline_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    auto& slot = values_[name];
    if (it->second.kind == Kind::kValue) slot.clear();
    slot.push_back(value);
  }
  return absl::OkStatus();
}

std::string CliArgs::Help() const {
  std::string out;
  for (const auto& [name, spec] : specs_) {
    absl::StrAppend(&out, "  --", name, spec.kind == Kind::kSwitch ? "" : " VALUE",
                    spec.kind == Kind::kRepeated ? " (repeatable)" : "", "\n      ", spec.help,
                    "\n");
  }
  return out;
}

std::string CliArgs::String(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

std::vector<std::string> CliArgs::Strings(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

absl::StatusOr<int64_t> CliArgs::Int(const std::string& name, int64_t fallback) const {
  if (!Has(name)) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(String(name), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " expects an integer, got '",
                                                   String(name), "'"));
  }
  return v;
}

absl::StatusOr<double> CliArgs::Double(const std::string& name, double fallback) const {
  if (!Has(name)) return fallback;
  double v;
  if (!absl::SimpleAtod(String(name), &v)) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " expects a number, got '",
                                                   String(name), "'"));
  }
  return v;
}

}  // namespace lazyattn
