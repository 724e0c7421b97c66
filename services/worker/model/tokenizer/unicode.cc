#include "services/worker/model/tokenizer/unicode.h"

#include <algorithm>
#include <array>

#include "services/worker/model/tokenizer/unicode_tables.h"

namespace lazyattn {
namespace {

using unicode_internal::CodepointRange;
using unicode_internal::kCodepointRanges;
using unicode_internal::kNumCodepointRanges;

uint8_t LookupFlags(uint32_t cp) {
  const CodepointRange* begin = kCodepointRanges;
  const CodepointRange* end = kCodepointRanges + kNumCodepointRanges;
  // First range whose last >= cp.
  const CodepointRange* it = std::lower_bound(
      begin, end, cp, [](const CodepointRange& r, uint32_t value) { return r.last < value; });
  if (it != end && it->first <= cp) return it->flags;
  return 0;
}

// Flags of the Basic Multilingual Plane, expanded once (64 KiB) so that the common case is a load.
const std::array<uint8_t, 0x10000>& BmpFlags() {
  static const std::array<uint8_t, 0x10000>* const table = [] {
    auto* t = new std::array<uint8_t, 0x10000>();
    for (size_t i = 0; i < kNumCodepointRanges; ++i) {
      const CodepointRange& r = kCodepointRanges[i];
      if (r.first > 0xFFFF) break;
      const uint32_t last = std::min<uint32_t>(r.last, 0xFFFF);
      for (uint32_t cp = r.first; cp <= last; ++cp) (*t)[cp] = r.flags;
    }
    return t;
  }();
  return *table;
}

inline bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

uint8_t CodepointFlags(uint32_t cp) {
  if (cp < 0x10000) return BmpFlags()[cp];
  return LookupFlags(cp);
}

const char* UnicodeTablesVersion() { return unicode_internal::kUnicodeVersion; }

uint32_t DecodeUtf8Lenient(std::string_view text, size_t* pos) {
  const size_t i = *pos;
  const size_t n = text.size();
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char b0 = b(0);
  if (b0 < 0x80) {
    *pos = i + 1;
    return b0;
  }
  if ((b0 & 0xE0) == 0xC0) {
    if (i + 1 < n && IsContinuation(b(1))) {
      *pos = i + 2;
      return (static_cast<uint32_t>(b0 & 0x1F) << 6) | (b(1) & 0x3F);
    }
  } else if ((b0 & 0xF0) == 0xE0) {
    if (i + 2 < n && IsContinuation(b(1)) && IsContinuation(b(2))) {
      *pos = i + 3;
      return (static_cast<uint32_t>(b0 & 0x0F) << 12) | (static_cast<uint32_t>(b(1) & 0x3F) << 6) |
             (b(2) & 0x3F);
    }
  } else if ((b0 & 0xF8) == 0xF0) {
    if (i + 3 < n && IsContinuation(b(1)) && IsContinuation(b(2)) && IsContinuation(b(3))) {
      const uint32_t cp = (static_cast<uint32_t>(b0 & 0x07) << 18) |
                          (static_cast<uint32_t>(b(1) & 0x3F) << 12) |
                          (static_cast<uint32_t>(b(2) & 0x3F) << 6) | (b(3) & 0x3F);
      if (cp <= 0x10FFFF) {
        *pos = i + 4;
        return cp;
      }
    }
  }
  *pos = i + 1;
  return kReplacementCharacter;
}

std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) out.push_back(DecodeUtf8Lenient(text, &pos));
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp <= 0x10FFFF) {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    AppendUtf8(kReplacementCharacter, out);
  }
}

size_t Utf8CompletePrefixLength(std::string_view bytes) {
  const size_t n = bytes.size();
  size_t cont = 0;  // trailing continuation bytes
  while (cont < 3 && cont < n && IsContinuation(static_cast<unsigned char>(bytes[n - 1 - cont]))) {
    ++cont;
  }
  if (cont == n) return n;  // nothing but continuation bytes: never completes
  const size_t lead_pos = n - 1 - cont;
  const unsigned char lead = static_cast<unsigned char>(bytes[lead_pos]);
  size_t expected = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    expected = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    expected = 3;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    expected = 4;
  } else {
    return n;  // ASCII or a byte that never starts a valid sequence
  }
  if (cont + 1 >= expected) return n;  // complete (or over-long run of continuations)
  if (cont >= 1) {
    // The second byte's range is restricted for some leads; outside it the sequence can never
    // become valid, so there is nothing to wait for.
    const unsigned char second = static_cast<unsigned char>(bytes[lead_pos + 1]);
    unsigned char lo = 0x80, hi = 0xBF;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
    if (second < lo || second > hi) return n;
  }
  return lead_pos;
}

}  // namespace lazyattn
