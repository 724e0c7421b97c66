// One worker's Publish stream (gRPC callback API). The worker sends Hello first, then events,
// heartbeats and snapshots, each with the next `seq`. kvdir answers:
//   - after Hello: a LeaseGrant (lease_ms), then a SnapshotRequest with reason "reconnect";
//   - on a sequence gap: a SnapshotRequest with reason "sequence gap after N, got M" (events are
//     ignored until the snapshot arrives).
// The stream ends with
//   - OK when the worker half-closes;
//   - INVALID_ARGUMENT naming `request` for bytes that do not parse as a WorkerMessage. (The
//     method is registered raw, bytes in and out, for this: a typed reactor is told of a failed
//     parse as of a half-close, and would end such a stream OK.)
//   - INVALID_ARGUMENT naming the field for a malformed message (empty body, bad kind, negative
//     tokens, missing key, empty worker_id, a second Hello naming another worker);
//   - FAILED_PRECONDITION when the first message is not Hello;
//   - ABORTED when the stream no longer owns its worker (a newer stream said Hello for the same
//     worker id, or the lease expired): the worker should reconnect and say Hello;
//   - ALREADY_EXISTS naming hello.status.worker_id, both addresses and both peer hosts when
//     another live, connected worker at another address or from another peer host holds the id
//     (DirectoryIndex's file comment; the peer host is PeerHost() of the stream's peer); the
//     holder is untouched, its address is also in the trailing metadata kWorkerIdHolderKey
//     (common/kvdir_stream_trailer.h). Counted and logged, as a certificate mismatch is;
//   - RESOURCE_EXHAUSTED naming the bound (limits.max_workers for a new worker's hello;
//     limits.max_entries_per_worker for a snapshot or a stored event past it, which also drops
//     the worker's entries); INVALID_ARGUMENT for a worker id of a bad length or charset
//     (limits.max_worker_id_length) or a hello.status over 64 KiB. Each is counted and logged.
//   - CANCELLED (for the worker; kvdir logs and counts RESOURCE_EXHAUSTED) when 16 replies are
//     queued that the worker has not read, such as the lease grants of repeated hellos: the call
//     is cancelled since its pending write would never end;
//   - ALREADY_EXISTS naming hello.status.address and the holder when another live worker
//     advertises the address (DirectoryIndex's file comment).
//   - PERMISSION_DENIED naming hello.status.address under mutual TLS when the address's host
//     (DialedHost) is not among the worker certificate's DNS and IP names: a router dialling it
//     would not accept the certificate, so the address cannot be this worker's, and taking it
//     would lock out the worker it belongs to; for a local socket or an address that picks
//     its DNS server (DialsOverTheNetwork), where every router would connect wherever it
//     points; and for a local host (IsLocalHost) from a worker not connected over loopback.
//     Counted and logged.
//   - RESOURCE_EXHAUSTED at once, before any read, naming limits.max_publish_streams or
//     limits.max_streams_per_certificate when the stream would pass one (PublishStreams);
//   - CANCELLED (for the worker; kvdir logs and counts hello_timeout) when no hello was accepted
//     within limits.hello_timeout_ms of the stream's start: the sweeper cancels it;
//   - RESOURCE_EXHAUSTED naming limits.max_publish_entries_per_s, before the message is applied,
//     when the streams of the worker's certificate (without mutual TLS: this stream) have used
//     their budget of directory work (PublishStreams::Charge). Counted and logged.
// Closing the stream does not remove the worker; its lease does (see DirectoryIndex).
//
// Threading: reads are sequential (one outstanding read), so the read side (Handle and the
// session fields) needs no lock; replies go through a queue under mu_ because OnWriteDone runs
// concurrently with OnReadDone. gRPC calls (StartWrite, Finish) are made outside mu_.
#ifndef LAZYATTN_SERVICES_KVDIR_SERVER_PUBLISH_REACTOR_H_
#define LAZYATTN_SERVICES_KVDIR_SERVER_PUBLISH_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/certificate_names.h"
#include "lazyattn/v1/kvdir.pb.h"
#include "services/kvdir/server/service_context.h"

namespace lazyattn::kvdir {

class PublishReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Who opened the stream, from the verified client certificate (mutual TLS); all empty when the
  // server runs without peer authorization, and then any id and address are taken. Either way
  // one id has one live holder: two processes sharing a certificate are two claims on one id.
  struct Caller {
    // The worker name in the certificate (lazyattn://worker/NAME): hello may only claim it.
    std::string worker_id;
    // Its serial (hex), logged with the hello so a rotation can be seen; may be empty.
    std::string certificate_serial;
    // Its DNS and IP names: with worker_id set, hello.status.address must dial one of them.
    CertificateNames certificate_names;
  };
  // Starts reading at once. Deletes itself in OnDone. `call`: the RPC's context (for trailing
  // metadata), outlives the reactor.
  PublishReactor(grpc::CallbackServerContext* call, const ServiceContext& ctx, Caller caller);

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  absl::Status Handle(const v1::WorkerMessage& msg);
  // Charges the message's directory work to the stream's budget (PublishStreams::Charge); counts,
  // logs and returns the RESOURCE_EXHAUSTED of a worker past limits.max_publish_entries_per_s.
  absl::Status ChargeWork(const v1::WorkerMessage& msg);
  // Ends the stream for an error (`status` of Handle), else reads the next message.
  void AfterHandle(absl::Status status);
  absl::Status HandleHello(const v1::WorkerMessage& msg);
  // OK, or counts, logs and returns the PERMISSION_DENIED of a hello whose `address` dials a
  // host the caller's certificate does not name (mutual TLS only).
  absl::Status CheckAddressIsCertified(const std::string& id, const std::string& address);
  // Counts, logs and returns the ALREADY_EXISTS of a hello for an id another live worker holds
  // (`held`: the index's refusal); `claimant`: the address this hello advertised.
  absl::Status WorkerIdInUse(const std::string& id, const HelloResult& held,
                             const std::string& claimant);
  // Acts on what the index said about a message; an error ends the stream.
  absl::Status AfterApply(const ApplyResult& result, uint64_t seq);
  // Counts, logs and returns the RESOURCE_EXHAUSTED of a worker past max_entries (all workers'
  // entries together).
  absl::Status OverTotalEntryLimit(const std::string& what);
  // Counts, logs and returns the RESOURCE_EXHAUSTED of a worker past max_entries_per_worker.
  absl::Status OverEntryLimit(const std::string& what);
  // Counts, logs and returns the RESOURCE_EXHAUSTED of a worker that reads none of its replies.
  absl::Status RepliesUnread();
  void RequestSnapshot(const std::string& reason, bool gap);
  void Send(v1::DirectoryMessage msg);
  // Leaves the session and finishes the stream once queued replies are written.
  void Close(const grpc::Status& status);

  grpc::CallbackServerContext* const call_;
  const std::string peer_host_;  // the stream's peer without the port (peer_host.h)
  const ServiceContext ctx_;
  const std::string bound_worker_id_;
  const std::string certificate_serial_;
  const CertificateNames certificate_names_;
  grpc::ByteBuffer in_bytes_;  // what the outstanding read fills
  v1::WorkerMessage in_;       // in_bytes_ parsed
  // Read side only (see the threading note).
  std::string worker_id_;
  uint64_t session_ = 0;
  // This stream's id in ctx_.streams; 0 when refused there or when there is no registry.
  uint64_t stream_id_ = 0;

  // Replies queued and not yet written. A worker answers each with its own messages, so a
  // sound one never leaves more than a few behind (a hello queues two).
  static constexpr size_t kMaxUnreadReplies = 16;

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> out_ ABSL_GUARDED_BY(mu_);  // serialized; front is being written
  // Send found kMaxUnreadReplies queued: the read side ends the stream.
  bool replies_unread_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyattn::kvdir

#endif  // LAZYATTN_SERVICES_KVDIR_SERVER_PUBLISH_REACTOR_H_
