// TensorFlow ops over the commsched engine: CommschedSubmit (copies a tensor into a buffer the engine owns for the
// task and queues the task; returns a ticket) and CommschedWait (an asynchronous kernel that completes when the
// ticket's task has, and outputs the buffer). Built against the installed TensorFlow (tf.sysconfig flags) by
// python/commsched/tensorflow/native.py; nothing of commsched is linked in: the kernels submit through the C entry
// point of the commsched._C module, whose address (and the Context's) Python hands over with commsched_tf_bind().
//
// Threading: the engine completes tasks on its scheduler thread, which must not run TensorFlow work, so the
// completion only records the status and hands the waiting kernel's `done` to TensorFlow's thread pool.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/env.h"

using namespace tensorflow;

namespace {

using DoneFn = void (*)(void* arg, int ok, const char* message);
using SubmitFn = int (*)(void* context, const char* name, int32_t priority, const char* op, const char* dtype,
                         void* data, uint64_t count, int32_t root, const char* compression, int flush, DoneFn done,
                         void* arg, char* err, size_t err_len);

std::atomic<SubmitFn> g_submit{nullptr};
std::atomic<void*> g_context{nullptr};

// One task in flight: the buffer the engine writes, and whoever waits for it.
struct Ticket {
  std::string name;
  Tensor buffer;
  std::mutex mu;
  bool finished = false;
  bool ok = false;
  std::string message;
  std::function<void()> on_finish;  // the waiting kernel's continuation, once it waits
};

std::mutex g_tickets_mu;
std::unordered_map<int64_t, std::shared_ptr<Ticket>> g_tickets;
std::atomic<int64_t> g_next_ticket{1};

void on_task_done(void* arg, int ok, const char* message) {  // the engine's scheduler thread
  auto* ticket = static_cast<Ticket*>(arg);
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> lock(ticket->mu);
    ticket->finished = true;
    ticket->ok = ok != 0;
    ticket->message = message ? message : "";
    next = std::move(ticket->on_finish);
  }
  if (next) Env::Default()->SchedClosure(std::move(next));
}

const char* engine_dtype(DataType t) {
  switch (t) {
    case DT_FLOAT: return "f32";
    case DT_DOUBLE: return "f64";
    case DT_HALF: return "f16";
    case DT_BFLOAT16: return "bf16";
    case DT_INT32: return "i32";
    case DT_INT64: return "i64";
    default: return nullptr;
  }
}

}  // namespace

extern "C" void commsched_tf_bind(void* submit, void* context) {
  g_submit.store(reinterpret_cast<SubmitFn>(submit));
  g_context.store(context);
}

REGISTER_OP("CommschedSubmit")
    .Input("tensor: T")
    .Output("ticket: int64")
    .Attr("T: {float, double, half, bfloat16, int32, int64}")
    .Attr("task_name: string")
    .Attr("priority: int = 0")
    .Attr("op: string = 'reduce'")
    .Attr("root: int = 0")
    .Attr("compression: string = ''")
    .Attr("flush: bool = false")
    .SetIsStateful()
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc("Copies `tensor` into a buffer of its own and queues one commsched task over it; returns a ticket.");

REGISTER_OP("CommschedWait")
    .Input("ticket: int64")
    .Output("result: T")
    .Attr("T: {float, double, half, bfloat16, int32, int64}")
    .SetIsStateful()
    .SetShapeFn(shape_inference::UnknownShape)
    .Doc("Completes once the ticket's task has; outputs its buffer (the task's result).");

class CommschedSubmitOp : public OpKernel {
 public:
  explicit CommschedSubmitOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("task_name", &name_));
    OP_REQUIRES_OK(c, c->GetAttr("priority", &priority_));
    OP_REQUIRES_OK(c, c->GetAttr("op", &op_));
    OP_REQUIRES_OK(c, c->GetAttr("root", &root_));
    OP_REQUIRES_OK(c, c->GetAttr("compression", &compression_));
    OP_REQUIRES_OK(c, c->GetAttr("flush", &flush_));
  }

  void Compute(OpKernelContext* c) override {
    SubmitFn submit = g_submit.load();
    void* context = g_context.load();
    OP_REQUIRES(c, submit != nullptr && context != nullptr,
                absl::FailedPreconditionError(absl::StrCat("commsched: task '", name_, "' before commsched.tensorflow.init()")));
    const Tensor& input = c->input(0);
    auto ticket = std::make_shared<Ticket>();
    ticket->name = name_;
    OP_REQUIRES_OK(c, c->allocate_temp(input.dtype(), input.shape(), &ticket->buffer));
    auto src = input.tensor_data();
    char* data = const_cast<char*>(ticket->buffer.tensor_data().data());
    if (!src.empty()) std::memcpy(data, src.data(), src.size());
    const int64_t id = g_next_ticket.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(g_tickets_mu);
      g_tickets[id] = ticket;
    }
    if (input.NumElements() == 0) {
      on_task_done(ticket.get(), 1, "");
    } else {
      char err[512] = {0};
      if (submit(context, name_.c_str(), static_cast<int32_t>(priority_), op_.c_str(), engine_dtype(input.dtype()),
                 data, static_cast<uint64_t>(input.NumElements()), static_cast<int32_t>(root_), compression_.c_str(),
                 flush_ ? 1 : 0, &on_task_done, ticket.get(), err, sizeof err) != 0) {
        std::lock_guard<std::mutex> lock(g_tickets_mu);
        g_tickets.erase(id);
        c->SetStatus(absl::InvalidArgumentError(absl::StrCat("commsched: task '", name_, "': ", err)));
        return;
      }
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(c, c->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = id;
  }

 private:
  std::string name_, op_, compression_;
  int64_t priority_ = 0, root_ = 0;
  bool flush_ = false;
};

class CommschedWaitOp : public AsyncOpKernel {
 public:
  explicit CommschedWaitOp(OpKernelConstruction* c) : AsyncOpKernel(c) {}

  void ComputeAsync(OpKernelContext* c, DoneCallback done) override {
    const int64_t id = c->input(0).scalar<int64_t>()();
    std::shared_ptr<Ticket> ticket;
    {
      std::lock_guard<std::mutex> lock(g_tickets_mu);
      auto it = g_tickets.find(id);
      if (it != g_tickets.end()) {
        ticket = it->second;
        g_tickets.erase(it);
      }
    }
    OP_REQUIRES_ASYNC(c, ticket != nullptr, absl::NotFoundError(absl::StrCat("commsched: unknown ticket ", id)), done);
    auto finish = [c, ticket, done]() {
      if (ticket->ok) {
        c->set_output(0, ticket->buffer);
      } else {
        c->SetStatus(
            absl::InternalError(absl::StrCat("commsched: communication of '", ticket->name, "' failed: ", ticket->message)));
      }
      done();
    };
    std::lock_guard<std::mutex> lock(ticket->mu);
    if (ticket->finished) {
      Env::Default()->SchedClosure(std::move(finish));
    } else {
      ticket->on_finish = std::move(finish);
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("CommschedSubmit").Device(DEVICE_CPU), CommschedSubmitOp);
REGISTER_KERNEL_BUILDER(Name("CommschedWait").Device(DEVICE_CPU), CommschedWaitOp);
