// Bad input on a Publish stream ends it with the right status naming the field or the limit: a
// first message that is not Hello, malformed messages, and the bounds on workers, entries per
// worker and worker ids (refusals counted); nothing bad is applied. A worker that reads none of
// its replies is ended rather than queued for. Fields kvdir does not know are not kept.
#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/kvdir/server/kvdir_server.h"
#include "services/kvdir/server/kvdir_server_test_fixture.h"

namespace lazyattn::kvdir {
namespace {

using ::testing::ElementsAre;
using testing::Entry;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::KvdirServerTest;
using testing::Pair;
using testing::WaitFor;

TEST_F(KvdirServerTest, FirstMessageMustBeHello) {
  Start();
  FakeWorker w(stub_.get(), "w1");
  w.Heartbeat();
  const grpc::Status s = w.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("hello"));
}

TEST_F(KvdirServerTest, MalformedMessagesEndTheStreamNamingTheField) {
  Start();
  // gRPC would dial 99999 as 34463: routers refuse it, so the directory does.
  for (const char* address : {"w0:99999", "w0:0", "[::1]:123456789012"}) {
    FakeWorker w(stub_.get(), "w0");
    w.Hello(1, address);
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << address;
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.address: ")) << address;
    EXPECT_THAT(s.error_message(), HasSubstr("the port must be a number from 1 to 65535"))
        << address;
  }
  {
    FakeWorker w(stub_.get(), "");
    w.Hello();
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id"));
  }
  {
    FakeWorker w(stub_.get(), "w1");
    w.Join({});
    v1::WorkerMessage m;
    m.mutable_event()->set_kind(v1::DocEvent::KIND_UNSPECIFIED);
    w.Send(m);
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("event.kind"));
  }
  {
    FakeWorker w(stub_.get(), "w2");
    w.Join({Entry(1, 10), Entry(2, -5)});
    const grpc::Status s = w.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries[1].tokens"));
  }
  // Both workers stay registered (their leases run), holding nothing: no bad entry was applied.
  EXPECT_THAT(Tokens({1}), ElementsAre(Pair("w1", 0), Pair("w2", 0)));
}

// Publish with raw messages: `messages` written in order (each its bytes), then the stream's
// status. A read is kept outstanding so kvdir's replies (a hello's lease grant) flow.
grpc::Status PublishRawBytes(const std::shared_ptr<grpc::Channel>& channel,
                             const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&context, "/lazyattn.v1.KvDirectory/Publish", &cq);
  void* tag = nullptr;
  bool ok = false;
  call->StartCall(reinterpret_cast<void*>(1));
  EXPECT_TRUE(cq.Next(&tag, &ok) && ok) << "the Publish call did not start";
  for (const std::string& bytes : messages) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer message(&slice, 1);
    call->Write(message, reinterpret_cast<void*>(2));
    if (!cq.Next(&tag, &ok) || !ok) break;  // kvdir ended the stream: its status says why
  }
  // Drain replies until the stream ends; kvdir must end it (no half-close is sent).
  grpc::ByteBuffer reply;
  do {
    call->Read(&reply, reinterpret_cast<void*>(3));
  } while (cq.Next(&tag, &ok) && ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

// Bytes that do not parse as a WorkerMessage end the stream INVALID_ARGUMENT naming `request`,
// first or after a hello, never OK as a half-close would; the worker's hello still holds.
TEST_F(KvdirServerTest, UnparsableMessagesEndTheStreamNamingRequest) {
  Start();
  const std::string bad_wire_type("\x0f\x01", 2), truncated("\x12\x7f\x0a", 3);
  for (const std::string& garbage : {bad_wire_type, truncated}) {
    const grpc::Status s = PublishRawBytes(channel_, {garbage});
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("request: not a valid protobuf message"));
  }
  v1::WorkerMessage hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_epoch(1);
  hello.mutable_hello()->mutable_status()->set_worker_id("w1");
  hello.mutable_hello()->mutable_status()->set_address("w1:7000");
  const grpc::Status s = PublishRawBytes(channel_, {hello.SerializeAsString(), truncated});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("/lazyattn.v1.KvDirectory/Publish"));
  EXPECT_THAT(Tokens({1}), ElementsAre(Pair("w1", 0)));
}

TEST_F(KvdirServerTest, BoundsEndTheStreamNamingTheLimitAndAreCounted) {
  KvdirOptions options;
  options.limits.max_workers = 1;
  options.limits.max_entries_per_worker = 3;
  options.limits.max_worker_id_length = 8;
  StartWith(options);
  FakeWorker w1(stub_.get(), "w1");
  w1.Join({Entry(1, 10), Entry(2, 20), Entry(3, 30)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2, 3}) == std::vector<Pair>{{"w1", 60}}; }));

  // A second worker when one is the maximum.
  FakeWorker w2(stub_.get(), "w2");
  ASSERT_TRUE(w2.Hello());
  grpc::Status s = w2.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_workers 1"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_workers"), 1);
  EXPECT_THAT(LiveWorkers(), ElementsAre("w1"));

  // Replacing an entry it holds is fine at the bound; a fourth entry is not, and drops them all.
  v1::WorkerMessage replace;
  replace.mutable_event()->set_kind(v1::DocEvent::STORED);
  *replace.mutable_event()->mutable_entry() = Entry(3, 31);
  ASSERT_TRUE(w1.Send(replace));
  ASSERT_TRUE(WaitFor([&] { return Tokens({3}) == std::vector<Pair>{{"w1", 31}}; }));
  ASSERT_TRUE(w1.Stored(4, 40));
  s = w1.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("event.stored"));
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_entries_per_worker (3)"));
  EXPECT_THAT(Tokens({1, 2, 3, 4}), ElementsAre(Pair("w1", 0)));  // registered, holding nothing
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries_per_worker"), 1);

  // A snapshot larger than the bound is refused whole.
  FakeWorker again(stub_.get(), "w1");
  again.Join({Entry(1, 1), Entry(2, 2), Entry(3, 3), Entry(4, 4)});
  s = again.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries: 4 entries"));
  EXPECT_THAT(Tokens({1, 2, 3, 4}), ElementsAre(Pair("w1", 0)));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries_per_worker"), 2);

  // Worker ids: too long, or outside the charset.
  for (const std::string& id : std::vector<std::string>{"worker-123", "w 1", std::string("w\0x", 3), "w/1"}) {
    FakeWorker bad(stub_.get(), id);
    ASSERT_TRUE(bad.Hello());
    s = bad.Drain();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(s.error_message(), HasSubstr("hello.status.worker_id: expected 1 to 8"));
  }
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "worker_id"), 4);
  // Host:port ids (a worker's default) and bracketed IPv6 pass the charset.
  KvdirOptions wide;
  wide.limits.max_worker_id_length = 64;
  server_.reset();
  StartWith(wide);
  FakeWorker hostport(stub_.get(), "[::1]:7201");
  hostport.Join({});
  ASSERT_TRUE(WaitFor([&] { return LiveWorkers() == std::vector<std::string>{"[::1]:7201"}; }));
  EXPECT_TRUE(hostport.Close().ok());
}

// limits.max_entries bounds the directory's memory over all workers: a snapshot that would go past
// it ends that worker's stream naming the limit (counted as max_entries); the others keep theirs.
TEST_F(KvdirServerTest, ASnapshotPastTheTotalEntryBoundEndsItsStreamNamingTheLimit) {
  KvdirOptions options;
  options.limits.max_entries = 2;
  StartWith(options);
  FakeWorker w1(stub_.get(), "w1");
  w1.Join({Entry(1, 10), Entry(2, 20)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1, 2}) == std::vector<Pair>{{"w1", 30}}; }));
  FakeWorker w2(stub_.get(), "w2");
  w2.Join({Entry(3, 30)});
  const grpc::Status s = w2.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("limits.max_entries (2)"));
  EXPECT_THAT(s.error_message(), HasSubstr("snapshot.entries: 1 entries"));
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "max_entries"), 1);
  EXPECT_THAT(Tokens({1, 2, 3}), ElementsAre(Pair("w1", 30), Pair("w2", 0)));
}

// A worker's status and load are kept and copied into every Lookup and ListWorkers answer, so
// fields this build does not know (proto3 would keep them) are dropped on arrival: a heartbeat
// or snapshot whose load carries a megabyte under an unknown tag (the status's size is checked at
// hello only), or a hello with unknown fields, adds nothing to the answers.
TEST_F(KvdirServerTest, UnknownFieldsInAWorkersStatusOrLoadAreNotKept) {
  Start();
  const std::string megabyte(1 << 20, 'x');
  FakeWorker w(stub_.get(), "w1");
  {
    v1::WorkerMessage hello;
    v1::WorkerStatus* status = hello.mutable_hello()->mutable_status();
    status->set_worker_id("w1");
    status->set_address("w1:7000");
    status->GetReflection()->MutableUnknownFields(status)->AddLengthDelimited(99, "unknown");
    hello.mutable_hello()->set_epoch(1);
    ASSERT_TRUE(w.Send(hello));
  }
  v1::DirectoryMessage reply;
  ASSERT_TRUE(w.Read(&reply));
  ASSERT_TRUE(reply.has_lease());
  ASSERT_TRUE(w.Read(&reply));
  ASSERT_TRUE(reply.has_snapshot_request());
  v1::WorkerMessage snapshot;
  v1::WorkerLoad* snapshot_load = snapshot.mutable_snapshot()->mutable_load();
  snapshot_load->set_waiting_requests(2);
  snapshot_load->GetReflection()
      ->MutableUnknownFields(snapshot_load)
      ->AddLengthDelimited(98, megabyte);
  ASSERT_TRUE(w.Send(snapshot));
  v1::WorkerMessage heartbeat;
  v1::WorkerLoad* load = heartbeat.mutable_heartbeat()->mutable_load();
  load->set_running_requests(3);
  load->GetReflection()->MutableUnknownFields(load)->AddLengthDelimited(99, megabyte);
  ASSERT_TRUE(w.Send(heartbeat));

  v1::LookupResponse response;
  ASSERT_TRUE(WaitFor([&] {
    response.Clear();
    return Lookup({1}, &response).ok() && response.workers_size() == 1 &&
           response.workers(0).worker().load().running_requests() == 3;
  }));
  EXPECT_LT(response.ByteSizeLong(), 1024u);
  const v1::WorkerStatus& kept = response.workers(0).worker();
  EXPECT_TRUE(kept.GetReflection()->GetUnknownFields(kept).empty());
  EXPECT_TRUE(kept.load().GetReflection()->GetUnknownFields(kept.load()).empty());
  EXPECT_EQ(kept.address(), "w1:7000");  // the known fields are kept
  EXPECT_TRUE(w.Close().ok());
}

// A worker that keeps saying hello and reads none of the replies (each hello queues a lease grant
// and a snapshot request) does not make kvdir queue them without end: once 16 replies wait
// unwritten, the stream is ended and counted as unread_replies. Here that happens within a few
// dozen hellos, as gRPC finishes writes more slowly than a burst of hellos arrives; a peer that
// never reads reaches it at the latest when its flow-control window is full.
TEST_F(KvdirServerTest, AWorkerThatReadsNoRepliesIsEnded) {
  Start();
  grpc::ChannelArguments args;
  // The window stays at its first size (64 KiB) rather than growing with the traffic, so even a
  // machine that writes as fast as the hellos come fills it long before the 10 s deadline.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub = v1::KvDirectory::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", server_->port()), grpc::InsecureChannelCredentials(), args));
  FakeWorker deaf(stub.get(), "deaf");
  int hellos = 0;
  while (deaf.Hello()) ++hellos;  // until kvdir ends the stream (or the 10 s deadline passes)
  EXPECT_GT(hellos, 16);
  const grpc::Status s = deaf.Drain();
  EXPECT_THAT(s.error_code(),
              ::testing::AnyOf(grpc::StatusCode::RESOURCE_EXHAUSTED, grpc::StatusCode::CANCELLED))
      << s.error_message();
  EXPECT_EQ(MetricValue("lazyattn_kvdir_limit_refusals_total", "unread_replies"), 1)
      << hellos << " hellos";
  // The directory serves on.
  FakeWorker sound(stub_.get(), "sound");
  sound.Join({Entry(1, 10)});
  ASSERT_TRUE(WaitFor([&] { return Tokens({1}).size() == 2; }));
  EXPECT_TRUE(sound.Close().ok());
}

}  // namespace
}  // namespace lazyattn::kvdir
