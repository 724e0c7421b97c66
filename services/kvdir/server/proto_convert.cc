#include "services/kvdir/server/proto_convert.h"

#include "absl/strings/str_cat.h"
#include "common/monotonic_time.h"

namespace lazyattn::kvdir {

absl::StatusOr<DocEntry> EntryFromProto(const v1::DocEntry& entry, const std::string& field) {
  if (!entry.has_key()) return absl::InvalidArgumentError(absl::StrCat(field, ".key: missing"));
  if (entry.tokens() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".tokens: must be >= 0, got ", entry.tokens()));
  }
  if (entry.offset() < kLazyOffset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".offset: must be >= 0, or -1 for a position-agnostic entry, got ", entry.offset()));
  }
  return DocEntry{KeyFromProto(entry.key()), entry.tokens(), entry.offset()};
}

absl::StatusOr<DocEvent> EventFromProto(const v1::DocEvent& event) {
  DocEvent out;
  switch (event.kind()) {
    case v1::DocEvent::STORED:
      out.kind = DocEventKind::kStored;
      break;
    case v1::DocEvent::EVICTED:
      out.kind = DocEventKind::kEvicted;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("event.kind: must be STORED or EVICTED, got ", event.kind()));
  }
  auto entry = EntryFromProto(event.entry(), "event.entry");
  if (!entry.ok()) return entry.status();
  out.entry = *entry;
  return out;
}

absl::StatusOr<ResidencyRule> LookupRuleFromProto(const v1::LookupRequest& request) {
  if (request.offsets_size() != 0 && request.offsets_size() != request.keys_size()) {
    return absl::InvalidArgumentError(absl::StrCat("offsets: ", request.offsets_size(),
                                                   " offsets for ", request.keys_size(),
                                                   " keys (give one per key, or none)"));
  }
  for (int i = 0; i < request.offsets_size(); ++i) {
    if (request.offsets(i) < kUnknownOffset) {
      return absl::InvalidArgumentError(absl::StrCat(
          "offsets[", i, "]: must be >= 0, or -1 when unknown, got ", request.offsets(i)));
    }
  }
  switch (request.mode()) {
    case v1::CACHE_MODE_UNSPECIFIED:
      return ResidencyRule::kAnyEntry;
    case v1::CACHE_MODE_LAZY:
      return ResidencyRule::kLazy;
    case v1::CACHE_MODE_BLOCK:
      return ResidencyRule::kBlock;
    case v1::CACHE_MODE_PREFIX:
    case v1::CACHE_MODE_FULL:
      return ResidencyRule::kNone;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode: unknown cache mode ", static_cast<int>(request.mode())));
  }
}

void ResidencyToProto(WorkerResidency&& r, v1::WorkerResidency* out) {
  *out->mutable_worker() = std::move(r.status);
  out->set_resident_tokens(r.resident_tokens);
  out->mutable_resident()->Reserve(static_cast<int>(r.resident.size()));
  for (bool b : r.resident) out->add_resident(b);
  out->set_last_seen_unix_ms(absl::ToUnixMillis(WallTimeOf(r.last_seen)));
  out->set_copyable_tokens(r.copyable_tokens);
}

}  // namespace lazyattn::kvdir
