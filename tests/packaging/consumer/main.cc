// Sums a tensor through the installed commsched: a one-rank Context (loopback backend), one task, its result.
#include <cstdio>
#include <future>
#include <vector>

#include "plugins/api/context.h"

int main() {
  commsched::Context ctx;  // no cluster variables: one rank over loopback
  std::vector<float> grad(1000, 2.0f);
  std::promise<commsched::Status> done;
  commsched::Task t;
  t.name = "consumer.grad";
  t.op = ctx.reduce_op();
  t.count = grad.size();
  t.buffer.data = grad.data();
  t.on_done = [&](const commsched::Status& s) { done.set_value(s); };
  ctx.engine().submit(std::move(t));
  const commsched::Status s = done.get_future().get();
  ctx.shutdown();
  if (!s.ok() || grad[999] != 2.0f) {
    std::fprintf(stderr, "consumer: task failed: %s\n", s.message.c_str());
    return 1;
  }
  std::printf("consumer: summed %zu floats through commsched (%d rank)\n", grad.size(), ctx.size());
  return 0;
}
