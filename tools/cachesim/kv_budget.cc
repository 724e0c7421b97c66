#include "tools/cachesim/kv_budget.h"

#include <cctype>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lazyattn {

absl::StatusOr<ModelShape> FindModelShape(const std::string& name) {
  static const std::vector<ModelShape>& shapes = *new std::vector<ModelShape>{
      {.name = "llama3-8b", .layers = 32, .kv_heads = 8, .head_dim = 128},
      {.name = "smollm2-135m", .layers = 30, .kv_heads = 3, .head_dim = 64},
  };
  std::string known;
  for (const ModelShape& s : shapes) {
    if (s.name == name) return s;
    absl::StrAppend(&known, known.empty() ? "" : ", ", s.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--model: unknown model shape \"", name, "\" (known: ", known, ")"));
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  static const std::vector<std::pair<std::string, double>>& units =
      *new std::vector<std::pair<std::string, double>>{{"KiB", 1024.0},
                                                       {"MiB", 1024.0 * 1024},
                                                       {"GiB", 1024.0 * 1024 * 1024},
                                                       {"TiB", 1024.0 * 1024 * 1024 * 1024},
                                                       {"KB", 1e3},
                                                       {"MB", 1e6},
                                                       {"GB", 1e9},
                                                       {"TB", 1e12},
                                                       {"B", 1.0}};
  std::string number = text;
  double scale = 1.0;
  for (const auto& [suffix, factor] : units) {
    if (text.size() > suffix.size() &&
        text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0) {
      number = text.substr(0, text.size() - suffix.size());
      scale = factor;
      break;
    }
  }
  double value;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value) || value <= 0 ||
      value * scale > 9e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte size \"", text,
                     "\" (a positive number with KB, MB, GB, TB, KiB, MiB, GiB, "
                     "TiB or B, e.g. 1GiB)"));
  }
  return static_cast<int64_t>(std::llround(value * scale));
}

}  // namespace lazyattn
