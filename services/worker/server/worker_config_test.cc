// lazyattn-worker's YAML configuration: defaults, every key read, errors naming the key.
#include "services/worker/server/worker_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/runner_factory.h"
#include "services/worker/model/random_weights.h"

namespace lazyattn {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<WorkerConfig> Parse(const std::string& yaml) {
  YamlConfig config;
  if (absl::Status s = config.LoadString(yaml, "worker.yaml"); !s.ok()) return s;
  return WorkerConfigFromYaml(config);
}

TEST(WorkerConfigTest, MinimalConfigGetsDefaults) {
  auto c = Parse("model:\n  path: models/m.gguf\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_path, "models/m.gguf");
  EXPECT_EQ(c->backend, "cpu");
  EXPECT_EQ(c->kv_budget_bytes, int64_t{512} << 20);
  EXPECT_EQ(c->cpu_threads, 0);  // the physical cores
  EXPECT_EQ(c->cpu_activations, CpuActivations::kInt8);
  EXPECT_EQ(c->cpu_kv_cache, KvCacheDtype::kF16);
  EXPECT_EQ(c->server.grpc.listen_address, "127.0.0.1:7200");
  EXPECT_EQ(c->server.metrics_address, "127.0.0.1:9200");
  EXPECT_TRUE(c->kvdir.address.empty());
  EXPECT_TRUE(c->server.engine.pipeline_decode);
  EXPECT_EQ(c->server.engine.default_deadline, absl::Seconds(600));
  EXPECT_EQ(c->server.engine.max_waiting_requests, 1024);
  EXPECT_EQ(c->server.engine.max_queued_tokens, int64_t{1} << 22);
  EXPECT_EQ(c->server.engine.max_consecutive_step_failures, 3);
  EXPECT_FALSE(c->testing.any());  // fault injection is off unless configured
  const WorkerServerOptions o = ServerOptionsFor(*c, TinyTestConfig());
  EXPECT_FALSE(o.kvdir.has_value());  // standalone
  EXPECT_GT(o.engine.num_kv_blocks, 0);
}

TEST(WorkerConfigTest, EveryKey) {
  auto c = Parse(R"(
model: {path: m.gguf, name: smollm2}
backend: auto
worker: {id: w7, advertise_address: "worker-7.svc:7200"}
server:
  listen: 0.0.0.0:7300
  tls: {cert_file: c.pem, key_file: k.pem, ca_file: ca.pem}
  drain_announce_ms: 1500
engine: {kv_budget_bytes: 1048576, max_batch_tokens: 256, max_running: 8, pipeline_decode: false,
         prep_threads: 3, max_pending_preparations: 5, default_deadline_s: 90, cpu_threads: 3,
         cpu_activations: fp32, cpu_kv_cache: f32,
         max_waiting_requests: 12, max_queued_tokens: 4096, max_consecutive_step_failures: 5}
testing: {fail_steps_after: 7, sticky_error_after: 9, abort_on_prompt_marker: "POISON",
          hold_model_load_ms: 250}
limits:
  max_documents: 16
  max_tokens: 512
  max_stop_strings: 4
  max_document_id_bytes: 32
  max_message_bytes: 1048576
  default_max_tokens: 64
  max_buffered_tokens: 32
  shutdown_grace_ms: 250
kvdir:
  address: kvdir:7100
  lease_ms: 900
  reconnect_min_ms: 50
  reconnect_max_ms: 800
  max_queued_events: 100
  tls: {ca_file: ca.pem, cert_file: c.pem, key_file: k.pem}
metrics: {listen: ""}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend, "auto");  // resolved when the runner is made (runner_factory.h)
  EXPECT_EQ(c->server.service.model_name, "smollm2");
  EXPECT_EQ(c->server.service.worker_id, "w7");
  EXPECT_EQ(c->server.advertise_address, "worker-7.svc:7200");
  EXPECT_EQ(c->server.grpc.listen_address, "0.0.0.0:7300");
  EXPECT_EQ(c->server.grpc.tls.ca_file, "ca.pem");
  EXPECT_EQ(c->kv_budget_bytes, 1048576);
  EXPECT_EQ(c->cpu_threads, 3);
  EXPECT_EQ(c->cpu_activations, CpuActivations::kFp32);
  EXPECT_EQ(c->cpu_kv_cache, KvCacheDtype::kF32);
  EXPECT_EQ(c->server.engine.max_batch_tokens, 256);
  EXPECT_EQ(c->server.engine.max_consecutive_step_failures, 5);
  EXPECT_EQ(c->testing.fail_steps_after, 7);
  EXPECT_EQ(c->testing.sticky_error_after, 9);
  EXPECT_EQ(c->testing.abort_on_prompt_marker, "POISON");
  EXPECT_EQ(c->testing.hold_model_load_ms, 250);
  EXPECT_EQ(c->server.service.abort_on_prompt_marker, "POISON");
  EXPECT_EQ(c->server.engine.max_running, 8);
  EXPECT_FALSE(c->server.engine.pipeline_decode);
  EXPECT_EQ(c->server.engine.default_deadline, absl::Seconds(90));
  EXPECT_EQ(c->server.engine.max_waiting_requests, 12);
  EXPECT_EQ(c->server.engine.max_queued_tokens, 4096);
  EXPECT_EQ(c->server.limits.max_documents, 16);
  EXPECT_EQ(c->server.service.prep.threads, 3);
  EXPECT_EQ(c->server.service.prep.max_pending, 5);
  // The router's request limits, enforced by the worker's service too.
  EXPECT_EQ(c->server.service.limits.max_documents, 16);
  EXPECT_EQ(c->server.service.limits.max_tokens, 512);
  EXPECT_EQ(c->server.service.limits.max_stop_strings, 4);
  EXPECT_EQ(c->server.service.limits.max_document_id_bytes, 32);
  EXPECT_EQ(c->server.grpc.max_message_bytes, 1048576);
  EXPECT_EQ(c->server.service.default_max_tokens, 64);
  EXPECT_EQ(c->server.service.max_buffered_tokens, 32);
  EXPECT_EQ(c->server.shutdown_grace, absl::Milliseconds(250));
  EXPECT_EQ(c->server.drain_announce, absl::Milliseconds(1500));
  EXPECT_EQ(c->kvdir.lease, absl::Milliseconds(900));
  EXPECT_EQ(c->kvdir.min_backoff, absl::Milliseconds(50));
  EXPECT_EQ(c->kvdir.max_backoff, absl::Milliseconds(800));
  EXPECT_EQ(c->kvdir.max_queued_events, 100);
  EXPECT_EQ(c->kvdir.tls.cert_file, "c.pem");
  EXPECT_TRUE(c->server.metrics_address.empty());
  const WorkerServerOptions o = ServerOptionsFor(*c, TinyTestConfig());
  ASSERT_TRUE(o.kvdir.has_value());
  EXPECT_EQ(o.kvdir->address, "kvdir:7100");
  EXPECT_EQ(o.kvdir->max_message_bytes, 1048576);
  // 1 MiB over fp32 K+V of 2 layers x 2 heads x 16 dims x 16 tokens (8 KiB a block).
  EXPECT_EQ(o.engine.num_kv_blocks, 128);
}

// The default answer length stays within limits.max_tokens: refused above it when set, lowered
// to it when not.
TEST(WorkerConfigTest, DefaultMaxTokensStaysWithinTheLimit) {
  auto c = Parse("model: {path: m}\nlimits: {max_tokens: 64}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.service.default_max_tokens, 64);
  c = Parse("model: {path: m}\nlimits: {max_tokens: 64, default_max_tokens: 64}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.service.default_max_tokens, 64);
  c = Parse("model: {path: m}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server.service.default_max_tokens, 128);
}

TEST(WorkerConfigTest, ErrorsNameTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"backend: cpu\n", "model.path"},
      {"model: {path: m}\nbackend: tpu\n", "backend"},
      {"model: {path: m}\nengine: {max_running: 0}\n", "engine.max_running"},
      {"model: {path: m}\nengine: {max_running: 65536}\n", "engine.max_running"},
      {"model: {path: m}\nengine: {default_deadline_s: 0}\n", "engine.default_deadline_s"},
      {"model: {path: m}\nengine: {max_waiting_requests: 0}\n", "engine.max_waiting_requests"},
      {"model: {path: m}\nengine: {max_queued_tokens: -5}\n", "engine.max_queued_tokens"},
      {"model: {path: m}\nengine: {cpu_threads: 257}\n", "engine.cpu_threads"},
      {"model: {path: m}\nengine: {cpu_activations: int4}\n", "engine.cpu_activations"},
      {"model: {path: m}\nengine: {cpu_kv_cache: bf16}\n", "engine.cpu_kv_cache"},
      {"model: {path: m}\nengine: {cpu_kv_cache: 16}\n", "engine.cpu_kv_cache"},
      {"model: {path: m}\nengine: {kv_budget_bytes: lots}\n", "engine.kv_budget_bytes"},
      {"model: {path: m}\nengine: {pipeline_decode: sometimes}\n", "engine.pipeline_decode"},
      {"model: {path: m}\nserver: {drain_announce_ms: 60001}\n", "server.drain_announce_ms"},
      {"model: {path: m}\nserver: {drain_announce_ms: -1}\n", "server.drain_announce_ms"},
      {"model: {path: m}\nlimits: {max_documents: -1}\n", "limits.max_documents"},
      {"model: {path: m}\nlimits: {max_documents: 5000}\n", "limits.max_documents"},
      {"model: {path: m}\nlimits: {max_tokens: 0}\n", "limits.max_tokens"},
      {"model: {path: m}\nlimits: {max_tokens: 64, default_max_tokens: 65}\n",
       "limits.default_max_tokens"},
      {"model: {path: m}\nlimits: {max_stop_bytes: many}\n", "limits.max_stop_bytes"},
      {"model: {path: m}\nengine: {prep_threads: 0}\n", "engine.prep_threads"},
      {"model: {path: m}\nengine: {max_consecutive_step_failures: 0}\n",
       "engine.max_consecutive_step_failures"},
      {"model: {path: m}\ntesting: {fail_steps_after: -2}\n", "testing.fail_steps_after"},
      {"model: {path: m}\ntesting: {sticky_error_after: soon}\n", "testing.sticky_error_after"},
      {"model: {path: m}\ntesting: {abort_on_marker: x}\n", "testing.abort_on_marker"},
      {"model: {path: m}\ntesting: {hold_model_load_ms: -1}\n", "testing.hold_model_load_ms"},
      {"model: {path: m}\ntesting: {hold_model_load_ms: 600001}\n", "testing.hold_model_load_ms"},
      {"model: {path: m}\nengine: {max_pending_preparations: 0}\n",
       "engine.max_pending_preparations"},
      {"model: {path: m}\nengine: {max_pending_preparation_bytes: 1000}\n",
       "engine.max_pending_preparation_bytes"},
      {"model: {path: m}\nkvdir: {reconnect_min_ms: 500, reconnect_max_ms: 100}\n",
       "kvdir.reconnect_max_ms"},
      {"model: {path: m}\nserver: {tls: {cert_file: c.pem}}\n", "server.tls"},
      {"model: {path: m}\nserver: {listen: \"\"}\n", "server.listen"},
      {"model: {path: m}\nengine: {max_batch_token: 5}\n", "engine.max_batch_token"},
      {"model: {path: m}\nkvdir_address: x\n", "kvdir_address"},
  };
  for (const auto& [yaml, key] : cases) {
    auto c = Parse(yaml);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << yaml;
    EXPECT_THAT(c.status().message(), HasSubstr(key)) << yaml;
  }
}

// `cuda` is accepted exactly when this binary has the CUDA backend (a GPU is needed only later,
// when the runner is made).
TEST(WorkerConfigTest, CudaBackendNeedsItToBeBuiltIn) {
  auto c = Parse("model: {path: m}\nbackend: cuda\n");
  if (CudaBackendBuiltIn()) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->backend, "cuda");
  } else {
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr("backend"));
  }
}

}  // namespace
}  // namespace lazyattn
