// Decode-only steps replayed as CUDA graphs (CudaRunnerOptions::cuda_graphs): one launch instead
// of ~10 per layer. A graph per GraphKey (batch, bucketed table width, rotation, sampler); a shape
// runs eagerly the first time (cuBLASLt picks its algorithms, kernels set their attributes), is
// captured the second time and replayed from then on. Launch (cuda_step_launch.cc) keeps the
// sections a graph reads at the offsets it was captured with, and drops every graph when a
// buffer is reallocated.
#include <functional>

#include "common/status_macros.h"
#include "kernels/cuda/cuda_check.h"
#include "services/worker/cuda/cuda_runner_state.h"

namespace lazyattn {
namespace {

constexpr size_t kMaxGraphs = 512;

}  // namespace

void CudaModelRunner::State::ClearGraphs() {
  for (auto& [key, g] : graphs) {
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  }
  graphs.clear();
}

absl::Status CudaModelRunner::State::RunGraph(const GraphKey& key,
                                              const std::function<absl::Status()>& enqueue) {
  if (graphs.size() >= kMaxGraphs && !graphs.contains(key)) ClearGraphs();
  Graph& g = graphs[key];
  if (g.exec == nullptr && ++g.seen < 2) return enqueue();
  if (g.exec == nullptr) {
    cudaGraph_t graph = nullptr;
    RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const absl::Status captured = enqueue();
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!captured.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return captured;
    }
    RETURN_IF_CUDA_ERROR(ended);
    const cudaError_t made = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    RETURN_IF_CUDA_ERROR(made);
    ++graph_captures;
  }
  ++graph_launches;
  RETURN_IF_CUDA_ERROR(cudaGraphLaunch(g.exec, stream));
  return absl::OkStatus();
}

int64_t CudaModelRunner::graph_launches() const { return state_->graph_launches; }
int64_t CudaModelRunner::graph_captures() const { return state_->graph_captures; }

}  // namespace lazyattn
