#include "common/log.h"

#include <openssl/rand.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/utf8.h"
#include "common/yaml_config.h"

namespace lazyattn {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_json{false};
std::atomic<int> g_fd{STDERR_FILENO};

constexpr const char* kLevelNames[] = {"debug", "info", "warning", "error"};
constexpr const char* kLevelText[] = {"DEBUG", "INFO", "WARN", "ERROR"};

// `s` with what could forge or break a log line escaped: control characters (C0 and DEL, and the
// C1 range U+0080-U+009F, which some terminals act on) as \uXXXX, bytes that are not UTF-8 as
// U+FFFD (a JSON reader refuses the line otherwise), and with `json` also quotes and backslashes.
// Messages and values carry text from clients and peers (a worker's error message), which must
// not start a line of its own.
void AppendEscaped(std::string* out, std::string_view s, bool json) {
  std::string repaired;
  if (!IsValidUtf8(s)) {
    repaired = ToValidUtf8(s);
    s = repaired;
  }
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (json && (c == '"' || c == '\\')) {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
      continue;
    }
    const bool c1 = c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) < 0xA0;
    if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (c < 0x20 || c == 0x7f || c1) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c1 ? static_cast<unsigned char>(s[++i]) : c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
}

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  AppendEscaped(out, s, /*json=*/true);
  out->push_back('"');
}

// Text values are bare when they are printable ASCII without a space, a quote or '='; otherwise
// quoted with JSON's escapes, which read well in text too.
void AppendTextValue(std::string* out, std::string_view s) {
  bool plain = !s.empty();
  for (unsigned char c : s) {
    if (c <= 0x20 || c == '"' || c == '=' || c >= 0x7f) plain = false;
  }
  if (plain) {
    out->append(s);
  } else {
    AppendJsonString(out, s);
  }
}

void WriteAll(int fd, const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to log to: dropping the line beats failing the caller
    done += static_cast<size_t>(n);
  }
}

}  // namespace

absl::StatusOr<LogOptions> ReadLogOptions(const YamlConfig& config) {
  LogOptions o;
  absl::StatusOr<std::string> level = config.String("log.level", "info");
  if (!level.ok()) return level.status();
  absl::StatusOr<std::string> format = config.String("log.format", "text");
  if (!format.ok()) return format.status();
  bool found = false;
  for (int i = 0; i < 4; ++i) {
    if (*level == kLevelNames[i]) {
      o.level = static_cast<LogLevel>(i);
      found = true;
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(absl::StrCat(
        "log.level: expected debug, info, warning or error, got \"", *level, "\""));
  }
  if (*format == "json") {
    o.format = LogFormat::kJson;
  } else if (*format != "text") {
    return absl::InvalidArgumentError(
        absl::StrCat("log.format: expected text or json, got \"", *format, "\""));
  }
  return o;
}

std::string NewRequestId() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // The CSPRNG failed (never seen): ids need uniqueness, not secrecy.
    static std::atomic<uint64_t> counter{0};
    const uint64_t a = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
    const uint64_t b = counter.fetch_add(1) ^ (static_cast<uint64_t>(getpid()) << 32);
    memcpy(bytes, &a, 8);
    memcpy(bytes + 8, &b, 8);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (int i = 0; i < 16; ++i) {
    id[2 * i] = kHex[bytes[i] >> 4];
    id[2 * i + 1] = kHex[bytes[i] & 15];
  }
  return id;
}

bool IsValidRequestId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

const char* StatusCodeName(int code) {
  static const char* const kNames[] = {"ok",
                                       "cancelled",
                                       "unknown",
                                       "invalid_argument",
                                       "deadline_exceeded",
                                       "not_found",
                                       "already_exists",
                                       "permission_denied",
                                       "resource_exhausted",
                                       "failed_precondition",
                                       "aborted",
                                       "out_of_range",
                                       "unimplemented",
                                       "internal",
                                       "unavailable",
                                       "data_loss",
                                       "unauthenticated"};
  return code >= 0 && code <= 16 ? kNames[code] : "unknown";
}

std::string AdoptRequestId(std::string_view received) {
  return IsValidRequestId(received) ? std::string(received) : NewRequestId();
}

void ConfigureLogging(const LogOptions& options) {
  g_level.store(static_cast<int>(options.level));
  g_json.store(options.format == LogFormat::kJson);
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void SetLogSinkForTest(int fd) { g_fd.store(fd); }

LogLine::LogLine(LogLevel level, std::string_view component)
    : on_(LogEnabled(level)), level_(level), component_(on_ ? component : "") {}

void LogLine::Key(std::string_view key) {
  if (g_json.load()) {
    fields_.push_back(',');
    AppendJsonString(&fields_, key);
    fields_.push_back(':');
  } else {
    absl::StrAppend(&fields_, " ", absl::string_view(key.data(), key.size()), "=");
  }
}

LogLine& LogLine::Str(std::string_view key, std::string_view value) {
  if (!on_) return *this;
  Key(key);
  if (g_json.load()) {
    AppendJsonString(&fields_, value);
  } else {
    AppendTextValue(&fields_, value);
  }
  return *this;
}

LogLine& LogLine::Int(std::string_view key, int64_t value) {
  if (!on_) return *this;
  Key(key);
  absl::StrAppend(&fields_, value);
  return *this;
}

LogLine& LogLine::Num(std::string_view key, double value) {
  if (!on_) return *this;
  Key(key);
  // JSON has no NaN or infinity; a number that is not finite is written as null.
  if (value != value || value > 1.7e308 || value < -1.7e308) {
    fields_.append(g_json.load() ? "null" : "nan");
  } else {
    absl::StrAppend(&fields_, value);
  }
  return *this;
}

void LogLine::Msg(std::string_view message) {
  if (!on_) return;
  on_ = false;
  const std::string ts =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  const int level = static_cast<int>(level_);
  std::string line;
  if (g_json.load()) {
    line = absl::StrCat("{\"ts\":\"", ts, "\",\"level\":\"", kLevelNames[level],
                        "\",\"component\":");
    AppendJsonString(&line, component_);
    line.append(",\"msg\":");
    AppendJsonString(&line, message);
    absl::StrAppend(&line, fields_, "}\n");
  } else {
    line = absl::StrCat(ts, " ", kLevelText[level], " ", component_, ": ");
    AppendEscaped(&line, message, /*json=*/false);
    absl::StrAppend(&line, fields_, "\n");
  }
  WriteAll(g_fd.load(), line);
}

}  // namespace lazyattn
