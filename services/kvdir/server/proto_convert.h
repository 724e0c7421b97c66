// Conversions between the kvdir protos and the index's plain types, validating what comes from a
// worker. Errors are InvalidArgument naming the field path given by the caller
// ("snapshot.entries[3].tokens: must be >= 0, got -1").
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_PROTO_CONVERT_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_PROTO_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/document_key.h"
#include "lazyattn/v1/kvdir.pb.h"
#include "services/kvdir/index/directory_index.h"

namespace lazyattn::kvdir {

inline DocumentKey KeyFromProto(const v1::DocKey& k) { return DocumentKey{k.hi(), k.lo()}; }

// `field` is the path of `entry` in the message, e.g. "event.entry".
absl::StatusOr<DocEntry> EntryFromProto(const v1::DocEntry& entry, const std::string& field);

// Kind STORED or EVICTED and a valid entry.
absl::StatusOr<DocEvent> EventFromProto(const v1::DocEvent& event);

// The residency rule of a Lookup (its mode), after checking its offsets: as many as the keys or
// none, each >= -1 (kUnknownOffset). InvalidArgument naming "mode" or "offsets" otherwise.
absl::StatusOr<ResidencyRule> LookupRuleFromProto(const v1::LookupRequest& request);

// Moves the residency's status into `out`.
void ResidencyToProto(WorkerResidency&& r, v1::WorkerResidency* out);

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_PROTO_CONVERT_H_
