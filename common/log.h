// Process logs: one line per event on stderr, as text (default) or JSON lines (log.format: json),
// each with a UTC timestamp, a level, the component that wrote it and its fields:
//
//   text: 2026-12-02T05:30:00.123Z INFO router: request done request_id=7f3a... status=ok
//   json: {"ts":"2026-12-02T05:30:00.123Z","level":"info","component":"router",
//          "msg":"request done","request_id":"7f3a...","status":"ok"}
//
//   LogInfo("router").Str("request_id", id).Int("attempts", 2).Msg("request done");
//
// The line is built in the temporary and written by Msg() with one write(2), so lines of
// concurrent threads never interleave. Below the configured level, the builder does nothing
// (check LogEnabled() first when a field is costly to compute). Prompt text is logged only at
// debug level; that is the caller's contract (see the router's access log).
#ifndef LAZYATTN_COMMON_LOG_H_
#define LAZYATTN_COMMON_LOG_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace lazyattn {

class YamlConfig;

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText, kJson };

struct LogOptions {
  LogLevel level = LogLevel::kInfo;
  LogFormat format = LogFormat::kText;
};

// Reads log.level (debug|info|warning|error, default info) and log.format (text|json, default
// text); InvalidArgument naming the key and the bad value.
absl::StatusOr<LogOptions> ReadLogOptions(const YamlConfig& config);

// Process-wide; call once at start-up (before threads log). Thread-safe to read.
void ConfigureLogging(const LogOptions& options);
bool LogEnabled(LogLevel level);

// Where lines go (stderr by default); for tests. Not thread-safe against concurrent logging.
void SetLogSinkForTest(int fd);

// Request ids, carried in gRPC metadata under kRequestIdKey from the router to the worker and
// back to the client in initial metadata.
inline constexpr char kRequestIdKey[] = "x-request-id";
// A fresh random id: 32 lowercase hex characters (128 bits).
std::string NewRequestId();
// Whether a client's id may be adopted: 1-128 characters of [A-Za-z0-9._:-] (it lands in logs
// and metadata verbatim).
bool IsValidRequestId(std::string_view id);
// The id a process logs one request under: `received` (the caller's kRequestIdKey metadata, ""
// when absent) when it is a valid id, so the router's and the worker's lines about one request
// share it; else a fresh one.
std::string AdoptRequestId(std::string_view received);

// The lower-case name of a gRPC (= absl) status code, as log lines and metric labels spell it
// ("ok", "invalid_argument", ...); "unknown" for a number outside 0-16.
const char* StatusCodeName(int code);

class LogLine {
 public:
  LogLine(LogLevel level, std::string_view component);
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;

  LogLine& Str(std::string_view key, std::string_view value);
  LogLine& Int(std::string_view key, int64_t value);
  LogLine& Num(std::string_view key, double value);
  // Writes the line. A LogLine never written is dropped.
  void Msg(std::string_view message);

 private:
  void Key(std::string_view key);

  bool on_;
  LogLevel level_;
  std::string component_;
  std::string fields_;  // already formatted for the configured format
};

inline LogLine LogDebug(std::string_view component) { return {LogLevel::kDebug, component}; }
inline LogLine LogInfo(std::string_view component) { return {LogLevel::kInfo, component}; }
inline LogLine LogWarning(std::string_view component) { return {LogLevel::kWarning, component}; }
inline LogLine LogError(std::string_view component) { return {LogLevel::kError, component}; }

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_LOG_H_
