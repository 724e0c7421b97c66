// Typed reading of a process's YAML configuration (yaml-cpp). Every getter names the full key path
// in its error ("router.retries: expected an integer, got \"many\""), and after reading, Finish()
// rejects every key that nothing read, so a misspelt key is an error instead of a silent default.
//
//   YamlConfig cfg;
//   RETURN_IF_ERROR(cfg.LoadFile(path));
//   ASSIGN_OR_RETURN(options.port, cfg.Int("metrics.port", 9100));
//   RETURN_IF_ERROR(cfg.Finish());
#ifndef LAZYATTN_COMMON_YAML_CONFIG_H_
#define LAZYATTN_COMMON_YAML_CONFIG_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lazyattn {

// The one YAML document of `yaml` (a Null node for none), checked as every file the services read
// is: InvalidArgument naming `source` for malformed YAML, more than one document (what follows a
// `---` was silently ignored), a key given twice in any map (yaml-cpp keeps both and finds the
// first), a key that is not a scalar, or a tree that aliases make far larger than the text
// (a 600-byte chain of `&aN [*aN-1, ...]` is 10^12 nodes to any walk of it).
absl::StatusOr<YAML::Node> LoadOneYamlDocument(const std::string& yaml, const std::string& source);

class YamlConfig {
 public:
  // InvalidArgument (with line and column) for malformed YAML and what LoadOneYamlDocument
  // refuses; NotFound for a missing file.
  absl::Status LoadFile(const std::string& path);
  absl::Status LoadString(const std::string& yaml, const std::string& source = "<string>");

  // Dotted paths ("router.policy"); the fallback is used when the key is absent.
  bool Has(const std::string& path) const;
  absl::StatusOr<std::string> String(const std::string& path, const std::string& fallback) const;
  absl::StatusOr<int64_t> Int(const std::string& path, const int64_t& fallback) const;
  // Int() bounded to [lo, hi] (a fallback outside is refused too): the one way a bounded integer
  // is read, so every range error reads "SOURCE: key: must be in [lo, hi], got V".
  absl::StatusOr<int64_t> IntIn(const std::string& path, int64_t fallback, int64_t lo,
                                int64_t hi) const;
  absl::StatusOr<double> Double(const std::string& path, const double& fallback) const;
  absl::StatusOr<bool> Bool(const std::string& path, const bool& fallback) const;
  absl::StatusOr<std::vector<std::string>> StringList(const std::string& path) const;
  // Sub-configurations of a sequence of maps ("workers"), each reporting paths like
  // "workers[1].port". Call Finish() on each of them too.
  absl::StatusOr<std::vector<YamlConfig>> List(const std::string& path) const;

  // InvalidArgument naming every key that was present but never read.
  absl::Status Finish() const;
  const std::string& source() const { return source_; }

 private:
  absl::StatusOr<YAML::Node> Find(const std::string& path) const;  // Null node when absent
  void CollectUnread(const YAML::Node& node, const std::string& prefix,
                     std::vector<std::string>* out) const;

  YAML::Node root_;
  std::string source_;
  std::string prefix_;  // for sub-configurations
  mutable std::set<std::string> read_;
};

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_YAML_CONFIG_H_
