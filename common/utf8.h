// UTF-8 well-formedness (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF),
// shared by the request validator (user text must be UTF-8) and the worker's output path (generated
// bytes are made UTF-8 before they cross the wire in a proto3 `string`).
#ifndef LAZYATTN_COMMON_UTF8_H_
#define LAZYATTN_COMMON_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace lazyattn {

// The offset of the first byte of `text` that does not start a well-formed UTF-8 sequence (a stray
// continuation byte, a bad lead byte, or a sequence cut short or broken), or npos when `text` is
// valid UTF-8.
size_t FirstInvalidUtf8Byte(std::string_view text);

inline bool IsValidUtf8(std::string_view text) {
  return FirstInvalidUtf8Byte(text) == std::string_view::npos;
}

// `text` with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD
// (resynchronizing at the next byte).
std::string ToValidUtf8(std::string_view text);

}  // namespace lazyattn

#endif  // LAZYATTN_COMMON_UTF8_H_
