// Builds against the installed commsched only: a one-rank Context (loopback backend) sums a tensor, then the emulated
// training loop (commsched::workload) runs a two-layer profile on the same Context's engine and checks every sum.
#include <cstdio>
#include <chrono>
#include <vector>

#include "plugins/api/context.h"
#include "scheduler/completion_waiter.h"
#include "workload/synthetic_model.h"

namespace {

int sum_one_tensor(commsched::Context& ctx) {
  std::vector<float> grad(1000, 2.0f);
  commsched::CompletionWaiter done;
  commsched::Task t;
  t.name = "consumer.grad";
  t.op = ctx.reduce_op();
  t.count = grad.size();
  t.buffer.data = grad.data();
  t.on_done = done.callback();
  ctx.engine().submit(std::move(t));
  const commsched::Status s = done.wait(std::chrono::seconds(60));
  if (!s.ok() || grad[999] != 2.0f) {
    std::fprintf(stderr, "consumer: task failed: %s\n", s.message.c_str());
    return 1;
  }
  std::printf("consumer: summed %zu floats through commsched (%d rank)\n", grad.size(), ctx.size());
  return 0;
}

int run_emulated_loop(commsched::Context& ctx) {
  using commsched::sim::TensorProfile;
  const auto profile = commsched::sim::make_profile(
      "consumer-model", {TensorProfile{"l0.weight", 0, commsched::DType::f32, 4096, 100000, 200000},
                         TensorProfile{"l1.weight", 1, commsched::DType::f32, 65536, 100000, 200000}});
  commsched::SyntheticOptions o;
  o.iterations = 2;
  o.warmup = 1;
  o.op = ctx.reduce_op();
  const commsched::SyntheticResult r = commsched::run_synthetic_model(ctx.engine(), profile, o);
  if (!r.error.empty() || !r.data_ok || r.iteration_s.size() != 2 || r.tensors_fully_checked == 0) {
    std::fprintf(stderr, "consumer: emulated loop failed: '%s' (data %s, %zu iterations)\n", r.error.c_str(),
                 r.data_ok ? "ok" : "wrong", r.iteration_s.size());
    return 1;
  }
  std::printf("consumer: emulated %zu iterations of a %zu-tensor profile, %.1f ms each\n", r.iteration_s.size(),
              profile.tensors.size(), r.mean_s * 1e3);
  return 0;
}

}  // namespace

int main() {
  commsched::Context ctx;  // no cluster variables: one rank over loopback
  const int rc = sum_one_tensor(ctx) || run_emulated_loop(ctx);
  ctx.shutdown();
  return rc;
}
