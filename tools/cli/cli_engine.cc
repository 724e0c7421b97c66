#include "tools/cli/cli_engine.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lazyattn {

void DeclareSamplingFlags(CliArgs& args) {
  args.Declare("max-tokens", CliArgs::Kind::kValue, "tokens to generate at most (default 128)");
  args.Declare("temperature", CliArgs::Kind::kValue, "0 = greedy (default 0)");
  args.Declare("top-k", CliArgs::Kind::kValue, "keep the k most likely tokens (0 = off)");
  args.Declare("top-p", CliArgs::Kind::kValue, "nucleus sampling mass (1 = off)");
  args.Declare("seed", CliArgs::Kind::kValue, "random seed for sampling (default 0)");
  args.Declare("stop", CliArgs::Kind::kRepeated, "stop before this string");
  args.Declare("ignore-eos", CliArgs::Kind::kSwitch, "keep generating past end-of-generation");
}

absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args) {
  SamplingParams p;
  ASSIGN_OR_RETURN(int64_t max_tokens, args.Int("max-tokens", 128));
  ASSIGN_OR_RETURN(double temperature, args.Double("temperature", 0.0));
  ASSIGN_OR_RETURN(int64_t top_k, args.Int("top-k", 0));
  ASSIGN_OR_RETURN(double top_p, args.Double("top-p", 1.0));
  ASSIGN_OR_RETURN(int64_t seed, args.Int("seed", 0));
  p.max_tokens = static_cast<int>(max_tokens);
  p.temperature = static_cast<float>(temperature);
  p.top_k = static_cast<int>(top_k);
  p.top_p = static_cast<float>(top_p);
  p.seed = static_cast<uint64_t>(seed);
  p.stop = args.Strings("stop");
  p.ignore_eos = args.Has("ignore-eos");
  return p;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace lazyattn
